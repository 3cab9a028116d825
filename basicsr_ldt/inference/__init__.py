"""Running a trained network on images: the Python API (``api``: ``load_network``, ``upscale``),
tiled and bicubic forward passes (``tiling``) and side-by-side comparison grids (``compare``)."""
