"""``inference.py``: super-resolve your own photos (no ground truth) with a trained network.

One image at a time through :func:`basicsr_ldt.inference.api.upscale`, cut as ``--tile-mode`` says
with the keys, checks and code of ``test:`` and ``val:`` (memory is bounded by the largest image
with ``whole``, by a section or a tile otherwise). Everything that can be checked before the first
image is read is checked first (flags, input files, existing outputs, the network and its
checkpoint), so bad input costs nothing and writes nothing; an unreadable image later is one line
and the run goes on.
"""
import argparse
import os
import time
from typing import Any, Dict, List, Optional, Sequence

import cv2
import numpy as np
from tqdm import tqdm

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.flags import FlagParser
from basicsr_ldt.common.option_file import load_option_file
from basicsr_ldt.common.options import closest_key_hint
from basicsr_ldt.inference.api import loaded_network, network_scale, resolve_device, upscale
from basicsr_ldt.inference.settings import INFERENCE_DEFAULTS, TILE_MODES, inference_settings
from basicsr_ldt.ldt.precision import INFERENCE_DTYPES
from basicsr_ldt.weights.releases import releases

IMAGE_EXTENSIONS = ('.png', '.jpg', '.jpeg', '.bmp', '.tif', '.tiff', '.webp')
OUTPUT_EXTENSIONS = ('png', 'tif')


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = FlagParser('python inference.py',
                        description='Super-resolve images with a trained network (no ground truth needed).')
    parser.add_argument('--input', required=True, help='an image file or a folder of images')
    parser.add_argument('--output', required=True, help='folder for the results (created if missing)')
    parser.add_argument('--checkpoint', required=True,
                        help='net_g_*.pth of this project, an upstream release file, or a release name such as HAT_SRx4 '
                             '(= pretrained/HAT_SRx4.pth, see scripts/fetch_weights.py --list)')
    parser.add_argument('--arch', help='MambaIR, HAT or SAFMN with its classic x4 defaults (or use --opt; '
                                       'a release name as --checkpoint implies its network)')
    parser.add_argument('--scale', type=int, help='upscaling factor for --arch (default: 4) or to override --opt')
    parser.add_argument('--opt', help='a train/test option file whose network_g describes the network; its test: '
                                      'tile_mode, tile_size, tile_overlap and precision apply unless a flag gives them')
    parser.add_argument('--param-key', help="which weights of the checkpoint: params or params_ema (default: params_ema "
                                            'when the file has it, else params; the run says which it read)')
    parser.add_argument('--tile-mode',
                        help=f"how images are cut, as test:/val: tile_mode: {', '.join(TILE_MODES)} (official = the "
                             'official LDT evaluation; default: fixed with --tile-size, else whole)')
    parser.add_argument('--tile-size', '--tile', type=int,
                        help='fixed mode: LR tile size in pixels (default: 0 = not tiled)')
    parser.add_argument('--tile-overlap', type=int,
                        help=f"fixed mode: overlap between tiles (default: {INFERENCE_DEFAULTS['tile_overlap']})")
    parser.add_argument('--precision',
                        help=f"{', '.join(INFERENCE_DTYPES)} (default: {INFERENCE_DEFAULTS['precision']}; fp16 on "
                             'CUDA only)')
    parser.add_argument('--device', choices=['cpu', 'cuda'], help='default: cuda when available, else cpu')
    parser.add_argument('--force', action='store_true', help='overwrite existing output files')
    parser.add_argument('--suffix', default=None, help="appended to each output's stem (default: _x<scale>)")
    parser.add_argument('--ext', choices=OUTPUT_EXTENSIONS, default='png',
                        help='output format, both keep 16-bit depth and alpha (default: png)')
    return parser.parse_args(argv)


def list_images(path: str) -> List[str]:
    """The images to process: ``path`` itself, or the image files directly inside the folder."""
    if os.path.isfile(path):
        if not path.lower().endswith(IMAGE_EXTENSIONS):
            raise InputError(f"input '{path}' is not an image file ({', '.join(IMAGE_EXTENSIONS)})")
        return [path]
    if not os.path.isdir(path):
        raise InputError(f"input '{path}' does not exist")
    files = sorted(os.path.join(path, name) for name in os.listdir(path)
                   if name.lower().endswith(IMAGE_EXTENSIONS) and os.path.isfile(os.path.join(path, name)))
    if not files:
        raise InputError(f"input folder '{path}' has no images ({', '.join(IMAGE_EXTENSIONS)})")
    return files


def output_paths(files: Sequence[str], folder: str, suffix: str, ext: str, force: bool) -> List[str]:
    """One output per input; refuse duplicates, inputs as outputs and (without force) existing files."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise InputError(f"--output '{folder}' is a file; expected a folder (made when absent)")
    if '/' in suffix or os.sep in suffix:
        raise InputError(f"--suffix '{suffix}': expected text for the end of each file name, without '/'")
    outputs = [os.path.join(folder, f'{os.path.splitext(os.path.basename(f))[0]}{suffix}.{ext}') for f in files]
    seen = {}
    for source, target in zip(files, outputs):
        if target in seen:
            raise InputError(f"'{seen[target]}' and '{source}' would both be written to '{target}'")
        seen[target] = source
        if os.path.abspath(source) == os.path.abspath(target):
            raise InputError(f"output '{target}' is the input image itself; choose another --output or --suffix")
    inputs = {os.path.abspath(f) for f in files}
    overwritten = [(s, t) for s, t in zip(files, outputs) if os.path.abspath(t) in inputs]
    if overwritten:   # an earlier run's outputs in the input folder: upscaled again, and overwritten
        source, target = overwritten[0]
        raise InputError(f"'{target}' is an input and also the output of '{source}' (an earlier run's output in the "
                         'input folder?); choose another --output, or move the earlier outputs away')
    existing = [t for t in outputs if os.path.exists(t)]
    if existing and not force:
        raise InputError(f"{len(existing)} output file(s) exist already (e.g. '{existing[0]}'); "
                         'pass --force to overwrite them')
    return outputs


def read_image(path: str) -> np.ndarray:
    """An 8- or 16-bit image in RGB(A) or grayscale order, as :func:`upscale` expects, turned as viewers
    show it: ``IMREAD_UNCHANGED`` (which keeps alpha) skips a JPEG's EXIF orientation, so a phone photo
    came out on its side; without alpha the image is read again the way that applies it."""
    image = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    if image is None:
        raise InputError('cannot read it: not an image, or the file is corrupt')
    if image.ndim == 2 or image.shape[2] == 3:
        oriented = cv2.imread(path, cv2.IMREAD_ANYCOLOR | cv2.IMREAD_ANYDEPTH)
        if oriented is not None and oriented.dtype == image.dtype and oriented.ndim == image.ndim:
            image = oriented
    if image.dtype not in (np.uint8, np.uint16):
        raise InputError(f'{image.dtype} pixels are not supported (8- or 16-bit integers)')
    if image.ndim == 3 and image.shape[2] == 3:
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    if image.ndim == 3 and image.shape[2] == 4:
        return cv2.cvtColor(image, cv2.COLOR_BGRA2RGBA)
    return image


def write_image(image: np.ndarray, path: str) -> None:
    """Encode first, then write a temporary file and rename it: no half-written outputs."""
    if image.ndim == 3 and image.shape[2] == 3:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    elif image.ndim == 3 and image.shape[2] == 4:
        image = cv2.cvtColor(image, cv2.COLOR_RGBA2BGRA)
    ok, data = cv2.imencode(os.path.splitext(path)[1], image)
    if not ok:
        raise InputError(f"cannot encode '{path}'")
    tmp = os.path.join(os.path.dirname(path), f'.{os.path.basename(path)}.tmp')
    with open(tmp, 'wb') as handle:
        handle.write(data.tobytes())
    os.replace(tmp, path)


def settings_of_file(opt: str, flags: Dict[str, Any], device_type: str) -> Dict[str, Any]:
    """The option file's ``test:`` inference keys that no flag gives: test.py runs its images that way, so the
    same file given here gives the same pixels (a file without them, or a train file, gives none). ``--tile-mode``
    replaces the file's way of cutting whole: its tile size and overlap belong to its mode."""
    loaded = load_option_file(opt) if os.path.isfile(opt) else None   # a missing file: loaded_network says so
    section = loaded.get('test') if isinstance(loaded, dict) else None
    if not isinstance(section, dict):
        return {}
    inference_settings('test', section, device_type)   # a bad value, named as the file's key
    cutting = ('tile_mode', 'tile_size', 'tile_overlap') if flags['tile_mode'] is not None else ()
    return {key: section[key] for key in INFERENCE_DEFAULTS
            if key in section and flags[key] is None and key not in cutting}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit code (1 if any image failed)."""
    args = parse_args(argv)
    if args.opt is None and args.arch is None and args.checkpoint in releases():
        args.arch = releases()[args.checkpoint].network['type']   # released as that arch's classic x4 network
    if args.opt is None and args.arch is None:
        named = '' if os.path.exists(args.checkpoint) or os.sep in args.checkpoint else (
            f"; --checkpoint '{args.checkpoint}' is no file and no release name"
            f"{closest_key_hint(args.checkpoint, releases()) or ' (python scripts/fetch_weights.py --list)'}")
        raise InputError(f'give the network as --opt OPTION_FILE or --arch MambaIR|HAT|SAFMN{named}')
    if args.opt is not None and args.arch is not None:
        raise InputError('give either --opt or --arch, not both')
    device = resolve_device(args.device)
    inference = {key: getattr(args, key) for key in INFERENCE_DEFAULTS}   # None: not given
    taken = settings_of_file(args.opt, inference, device.type) if args.opt is not None else {}
    inference.update(taken)
    inference_settings(None, inference, device.type, flags=True)   # test's and val's checks, named as flags
    files = list_images(args.input)
    network, key = loaded_network(args.checkpoint, arch=args.arch, opt=args.opt, device=device, scale=args.scale,
                                  param_key=args.param_key)
    print(f"weights: {args.checkpoint} [{key or 'a bare state dict'}]", flush=True)
    if taken:
        print(f"from {args.opt} test: {', '.join(f'{k} {v}' for k, v in taken.items())}", flush=True)
    scale = network_scale(network)
    suffix = f'_x{scale}' if args.suffix is None else args.suffix
    outputs = output_paths(files, args.output, suffix, args.ext, args.force)
    made = not os.path.isdir(args.output)
    os.makedirs(args.output, exist_ok=True)
    written, failed, start = 0, [], time.time()
    for source, target in zip(tqdm(files, desc='upscale', unit='img', dynamic_ncols=True), outputs):
        try:
            result = upscale(network, read_image(source), **inference)
            write_image(result, target)
            written += 1
        except (InputError, cv2.error) as err:
            failed.append(source)
            tqdm.write(f"failed: '{source}': {str(err).strip().splitlines()[0]}")
    seconds = time.time() - start
    if made and not written:   # nothing to show for it: the folder this run made goes again
        os.rmdir(args.output)
    print(f'{written} written, {len(failed)} failed, to {args.output} '
          f'({seconds:.1f} s, {len(files) / max(seconds, 1e-9):.2f} images/s)', flush=True)
    return 1 if failed else 0
