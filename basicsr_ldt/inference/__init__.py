"""Running a trained network on images: the Python API (``api``: ``load_network``, ``upscale``),
the inference keys that ``test:``, ``val:``, ``upscale`` and ``inference.py`` share (``settings``),
official, tiled and bicubic forward passes (``tiling``) and side-by-side comparison grids (``compare``)."""
