"""Per-camera evaluation: ``python test.py -opt options/test.yml``.

Reports PSNR and SSIM the way the LDT paper's Table 1 does: BasicSR's ``calculate_psnr`` and
``calculate_ssim`` on the Y channel with ``crop_border = scale``, averaged per camera, with one
column pair per checkpoint so FT, LDT and baselines sit side by side. A ``{bicubic: true}`` entry
is the Bicubic row every SR table needs: the LR image upscaled by ``bicubic_upscale`` and measured
by the same code as the networks.
"""
import csv
import json
import logging
from collections import OrderedDict
from os import path as osp
from typing import Any, Dict, List, Mapping, Optional

import torch
from tqdm import tqdm

from basicsr.archs import build_network
from basicsr.metrics.psnr_ssim import calculate_psnr, calculate_ssim
from basicsr.utils import get_root_logger, get_time_str, imwrite, tensor2img
from basicsr.utils.dist_util import get_dist_info
from basicsr.utils.options import dict2str
from basicsr.utils.registry import ARCH_REGISTRY, DATASET_REGISTRY

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.metric_crop import check_crop_border
from basicsr_ldt.common.option_file import parse_options
from basicsr_ldt.common.options import check_known_keys, registered, validate_dataset_options
from basicsr_ldt.common.outputs import OutputFolder, fail
from basicsr_ldt.common.schema import section_keys
from basicsr_ldt.inference.compare import COMPARE_SPECS, Comparison, compare_settings
from basicsr_ldt.inference.settings import INFERENCE_DEFAULTS, INFERENCE_SPECS, inference_settings
from basicsr_ldt.inference.tiling import bicubic_upscale, run_inference
from basicsr_ldt.ldt.typed import boolean, check_options, integer, number, optional, string
from basicsr_ldt.models.network_check import probe_network
from basicsr_ldt.weights.checkpoint import describe_unloaded, load_weights
from basicsr_ldt.weights.interpolate import wise_ft_state

#: The ``test:`` section and its defaults (documented in docs/options.md).
#: (``tile_mode``, ``tile_size``, ``tile_overlap``, ``precision``: basicsr_ldt.inference.settings.)
TEST_DEFAULTS = {**INFERENCE_DEFAULTS, 'save_img': False, 'crop_border': None, 'test_y_channel': True,
                 'compare': None}
#: Types and ranges of the ``test:`` keys and of each ``checkpoints`` entry.
TEST_SPECS = {**INFERENCE_SPECS, 'save_img': boolean(), 'crop_border': optional(integer(0)),
              'test_y_channel': boolean(), **COMPARE_SPECS}
CHECKPOINT_SPECS = {'label': string(), 'path': string(), 'param_key': string(), 'bicubic': boolean()}
#: ``wise_ft:`` of a checkpoint entry: test (1 - alpha) start + alpha <path> (basicsr_ldt.weights.interpolate).
WISE_FT_SPECS = {'start': string(), 'alpha': number(0.0, 1.0, '[]'), 'start_param_key': string()}
#: The label of a ``{bicubic: true}`` entry when it gives none.
BICUBIC_LABEL = 'Bicubic'


def checkpoints_of(opt: Mapping) -> List[Dict]:
    """The checkpoints to compare: ``checkpoints:`` entries, or ``path.pretrain_network_g``."""
    entries = opt.get('checkpoints')
    if entries is not None and (opt.get('path') or {}).get('pretrain_network_g'):
        raise InputError("path.pretrain_network_g and 'checkpoints' both name weights to test, and only the checkpoints "
                         "list would be tested; make the file an entry of 'checkpoints', or remove one of the two")
    if entries is None:
        path = opt.get('path', {}).get('pretrain_network_g')
        if not path:
            raise InputError("give the weights to test as 'path: pretrain_network_g' or a 'checkpoints' list")
        entries = [{'label': osp.splitext(osp.basename(path))[0], 'path': path}]
    default_key = (opt.get('path') or {}).get('param_key_g', 'params')   # BasicSR's: falls back when absent
    if not isinstance(entries, list) or not entries:
        raise InputError("'checkpoints' must be a non-empty list of {label, path[, param_key]} entries")
    result = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            entry = {'path': entry}
        entry = dict(entry)
        wise_ft = entry.pop('wise_ft', None)
        check_known_keys(f'checkpoints[{i}]', entry, CHECKPOINT_SPECS)
        check_options(f'checkpoints[{i}]', entry, CHECKPOINT_SPECS, InputError)
        if wise_ft is not None:
            entry['wise_ft'] = _wise_ft_entry(wise_ft, f'checkpoints[{i}]', entry, default_key)
        if entry.get('bicubic'):
            extra = [key for key in ('path', 'param_key') if key in entry]
            if extra:
                raise InputError(f"checkpoints[{i}]: an entry with 'bicubic: true' upscales the LR image and "
                                 f"loads no weights, so it takes no {' or '.join(extra)}")
            result.append({'label': entry.get('label') or BICUBIC_LABEL, 'bicubic': True})
            continue
        if 'path' not in entry:
            raise InputError(f'checkpoints[{i}] has no path (or give bicubic: true for the Bicubic baseline)')
        label = entry.get('label') or osp.splitext(osp.basename(entry['path']))[0]
        result.append({'label': label, 'path': entry['path'], 'bicubic': False,   # a key named here is exact
                       'param_key': entry.get('param_key', default_key), 'exact_key': 'param_key' in entry})
        if 'wise_ft' in entry:
            result[-1]['wise_ft'] = entry['wise_ft']
    labels = [e['label'] for e in result]
    for i, label in enumerate(labels):   # a label names its checkpoint's image folder too
        if '/' in label or '\\' in label or label.strip('.') == '':
            raise InputError(f"checkpoints[{i}].label: {label!r} also names the folder of its images; expected no "
                             "'/' and not only dots")
    if len(set(labels)) != len(labels):
        raise InputError(f'checkpoint labels must be unique, got {labels}')
    tested: Dict[str, int] = {}
    for i, entry in enumerate(result):   # a path pasted under a second label: its column repeats the first's
        weights = json.dumps({k: osp.realpath(v) if k == 'path' else v for k, v in entry.items()
                              if k not in ('label', 'exact_key')}, sort_keys=True)   # ./a.pth is a.pth
        if weights in tested:
            j = tested[weights]
            raise InputError(f"checkpoints[{i}] ('{entry['label']}') tests the same weights as checkpoints[{j}] "
                             f"('{result[j]['label']}'): its column would repeat that one; remove one, or correct "
                             'its path, param_key or wise_ft')
        tested[weights] = i
    return result


def _wise_ft_entry(spec, where: str, entry: Mapping, default_key: str) -> Dict:
    """A checked ``wise_ft: {start, alpha[, start_param_key]}`` block (the start's key: ``default_key``,
    ``path.param_key_g``'s, which may fall back; a ``start_param_key`` given is exact)."""
    if not isinstance(spec, Mapping):
        raise InputError(f'{where}.wise_ft: expected a mapping {{start, alpha[, start_param_key]}}, got {spec!r}')
    check_known_keys(f'{where}.wise_ft', spec, WISE_FT_SPECS)
    for key in ('start', 'alpha'):
        if key not in spec:
            raise InputError(f'{where}.wise_ft.{key}: required (WiSE-FT tests (1 - alpha) start + alpha <path>)')
    check_options(f'{where}.wise_ft', spec, WISE_FT_SPECS, InputError)
    if entry.get('bicubic'):
        raise InputError(f"{where}: an entry with 'bicubic: true' loads no weights to interpolate (wise_ft)")
    return {'start': spec['start'], 'alpha': float(spec['alpha']),
            'start_param_key': spec.get('start_param_key', default_key), 'start_exact': 'start_param_key' in spec}


def evaluate_image(sr: torch.Tensor, gt: torch.Tensor, crop_border: int, test_y_channel: bool) -> Dict[str, float]:
    """PSNR/SSIM of one image with BasicSR's metric functions on uint8 images."""
    sr_img, gt_img = tensor2img(sr), tensor2img(gt)
    return {'psnr': float(calculate_psnr(sr_img, gt_img, crop_border, test_y_channel=test_y_channel)),
            'ssim': float(calculate_ssim(sr_img, gt_img, crop_border, test_y_channel=test_y_channel))}


def summarise(per_image: List[Dict]) -> 'OrderedDict[str, Dict[str, float]]':
    """Mean PSNR/SSIM per camera and a 'Mean' row over cameras (each camera weighs the same)."""
    cameras: Dict[str, List[Dict]] = OrderedDict()
    for row in per_image:
        cameras.setdefault(row['camera'], []).append(row)
    table = OrderedDict()
    for camera in sorted(cameras):
        rows = cameras[camera]
        table[camera] = {m: sum(r[m] for r in rows) / len(rows) for m in ('psnr', 'ssim')}
        table[camera]['images'] = len(rows)
    table['Mean'] = {m: sum(v[m] for v in table.values()) / len(cameras) for m in ('psnr', 'ssim')}
    table['Mean']['images'] = len(per_image)
    return table


def format_table(tables: 'OrderedDict[str, OrderedDict]', markdown: bool) -> str:
    """Cameras as rows, ``<label> PSNR`` / ``<label> SSIM`` columns, like the paper's Table 1."""
    labels = list(tables)
    rows = list(next(iter(tables.values())))
    header = ['Camera', 'Images'] + [f'{label} {m}' for label in labels for m in ('PSNR', 'SSIM')]
    body = []
    for row in rows:
        cells = [row, str(tables[labels[0]][row]['images'])]
        for label in labels:
            cells += [f"{tables[label][row]['psnr']:.2f}", f"{tables[label][row]['ssim']:.4f}"]
        body.append(cells)
    if markdown:
        lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
        return '\n'.join(lines + ['| ' + ' | '.join(cells) + ' |' for cells in body])
    widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]
    return '\n'.join('  '.join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in [header] + body)


def measured_as(test_opt: Dict) -> Dict[str, Any]:
    """How the table's numbers were measured. Why: RGB without a crop reads about 1.7 dB lower than the
    paper's Y channel with a crop, and the files said only "PSNR"; a table copied out of its run now
    carries its measurement."""
    return {'channel': 'Y' if test_opt['test_y_channel'] else 'RGB', 'crop_border': test_opt['crop_border'],
            'inference': test_opt['inference'].describe()}


def measurement_line(measured: Mapping[str, Any]) -> str:
    channel = 'the Y channel' if measured['channel'] == 'Y' else 'RGB'
    return f"PSNR (dB) / SSIM on {channel}, crop_border {measured['crop_border']}; {measured['inference']}"


def write_results(folder: str, tables: 'OrderedDict[str, OrderedDict]', per_image: Dict[str, List[Dict]],
                  measured: Mapping[str, Any]) -> None:
    """Markdown, CSV and JSON copies of the table (JSON also holds every image's values); the Markdown
    and JSON say how the numbers were measured."""
    with open(osp.join(folder, 'metrics.md'), 'w') as handle:
        handle.write(format_table(tables, markdown=True) + f'\n\n{measurement_line(measured)}\n')
    with open(osp.join(folder, 'metrics.csv'), 'w', newline='') as handle:
        writer = csv.writer(handle)
        writer.writerow(['checkpoint', 'camera', 'images', 'psnr', 'ssim'])
        for label, table in tables.items():
            for camera, values in table.items():
                writer.writerow([label, camera, values['images'], f"{values['psnr']:.4f}", f"{values['ssim']:.6f}"])
    with open(osp.join(folder, 'metrics.json'), 'w') as handle:
        json.dump({'summary': tables, 'measured': dict(measured), 'images': per_image}, handle, indent=2)


def _build(opt: Dict, device: torch.device):
    """Validate options, datasets and the network type; checkpoints are loaded before a folder is created."""
    test_opt = dict(TEST_DEFAULTS)
    check_known_keys('test', opt.get('test') or {}, section_keys('test'))
    check_options('test', opt.get('test') or {}, TEST_SPECS, InputError)
    check_options('path', opt.get('path') or {}, {'strict_load_g': boolean()}, InputError)   # 'false' read as true
    test_opt.update(opt.get('test') or {})
    test_opt['inference'] = inference_settings('test', opt.get('test'), device.type)
    if test_opt['crop_border'] is None:
        test_opt['crop_border'] = opt.get('scale', 4)
    datasets = []
    for phase, dataset_opt in (opt.get('datasets') or {}).items():
        dataset_cls = registered(DATASET_REGISTRY, dataset_opt.get('type'), f'datasets.{phase}.type')
        validate_dataset_options(dataset_cls, phase, dataset_opt)
        datasets.append(dataset_cls(dataset_opt))
    if not datasets:
        raise InputError("the option file has no 'datasets' section to test on")
    sections = list((opt.get('datasets') or {}))
    for i, first in enumerate(datasets):   # rows are per camera: two sections would pool their images in one
        for j in range(i + 1, len(datasets)):
            shared = sorted(set(first.cameras) & set(datasets[j].cameras))
            if shared:
                raise InputError(f"camera '{shared[0]}' is in datasets.{sections[i]} and datasets.{sections[j]}; the "
                                 'table has one row per camera, so give each camera in one section only')
    checkpoints = checkpoints_of(opt)
    if not all(entry['bicubic'] for entry in checkpoints):   # Bicubic alone needs no network
        registered(ARCH_REGISTRY, (opt.get('network_g') or {}).get('type'), 'network_g.type')
        probe_network(opt['network_g'], opt.get('scale', 4), device_type=device.type)
    test_opt['compare'] = compare_settings(test_opt['compare'])
    return test_opt, datasets, checkpoints


def test_logger(log_file: str) -> logging.Logger:
    """BasicSR's root logger writing INFO to ``log_file``.

    Building a network first (BasicSR's ``build_network`` logs through ``get_root_logger``) already
    initialised that logger, without a file and at the default WARNING level, so a later
    ``get_root_logger(log_file=...)`` returned it unchanged and every INFO line of test.py was lost;
    the file and the level are added here when missing.
    """
    logger = get_root_logger(logger_name='basicsr', log_level=logging.INFO, log_file=log_file)
    if get_dist_info()[0] == 0 and not any(isinstance(h, logging.FileHandler) for h in logger.handlers):
        logger.setLevel(logging.INFO)
        handler = logging.FileHandler(log_file, 'w')
        handler.setFormatter(logging.Formatter('%(asctime)s %(levelname)s: %(message)s'))
        logger.addHandler(handler)
    return logger


def test_pipeline(root_path: str) -> 'OrderedDict[str, OrderedDict]':
    """Evaluate every checkpoint on every test dataset; print and write the per-camera table."""
    opt, args = parse_options(root_path, is_train=False)
    outputs = OutputFolder()
    try:
        device = torch.device('cuda' if opt['num_gpu'] and torch.cuda.is_available() else 'cpu')
        test_opt, datasets, checkpoints = _build(opt, device)
        networks = []
        for entry in checkpoints:
            if entry['bicubic']:
                networks.append(None)
                continue
            network = build_network(dict(opt['network_g']))
            if 'wise_ft' in entry:
                wise = entry['wise_ft']
                where = f'checkpoints[{checkpoints.index(entry)}]'
                network.load_state_dict(wise_ft_state(network, entry['path'], entry['param_key'], wise['start'],
                                                      wise['start_param_key'], wise['alpha'], where,
                                                      (not entry['exact_key'], not wise['start_exact'])))
            else:
                loaded = load_weights(network, entry['path'], entry['param_key'],
                                      strict=opt['path'].get('strict_load_g', True), fallback=not entry['exact_key'])
                entry['unloaded'], entry['loaded_key'] = describe_unloaded(loaded, network), loaded.key
            networks.append(network.to(device).eval())
        comparison = Comparison(test_opt['compare'], opt, checkpoints, datasets, device) if test_opt['compare'] else None
        outputs.create(opt['path']['results_root'])
        # a damaged image found only as its pixels are read fails here too: nothing of this run stays
        return _test_every_image(opt, args, test_opt, datasets, checkpoints, networks, comparison, device)
    except InputError as err:
        outputs.rollback()
        fail(str(err))


def _to_log_file(logger: logging.Logger, message: str, level: int = logging.WARNING) -> None:
    """What the console shows another way (a warning as it happened, before the log file began; the
    table, printed): written to the file only, so the console does not show it twice."""
    record = logger.makeRecord(logger.name, level, __file__, 0, message, None, None)
    for handler in logger.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _test_every_image(opt: Dict, args, test_opt: Dict, datasets: List, checkpoints: List[Dict], networks: List,
                      comparison: Optional[Comparison], device: torch.device) -> 'OrderedDict[str, OrderedDict]':
    """Run every network on every test image, then write and return the per-camera tables."""
    logger = test_logger(osp.join(opt['path']['log'], f"test_{opt['name'].replace('/', '_')}_{get_time_str()}.log"))
    if args.option_defaults:
        logger.info(args.option_defaults)
    logger.info(dict2str(opt))
    logger.info(f"Inference: {test_opt['inference'].describe()}")
    for entry in checkpoints:
        if entry.get('unloaded'):
            logger.warning(f"{entry['label']}: {entry['path']} loaded with strict_load_g false{entry['unloaded']}")
        if entry.get('loaded_key') not in (None, entry.get('param_key')):
            _to_log_file(logger, f"{entry['label']}: {entry['path']} has no '{entry['param_key']}' weights: loaded "
                                 f"'{entry['loaded_key']}'")
    scale = opt.get('scale', 4)
    per_image = {entry['label']: [] for entry in checkpoints}
    images = [(ds, i) for ds in datasets for i in range(len(ds))]
    for dataset, index in tqdm(images, desc='test', unit='img'):
        item = dataset[index]
        stem = osp.splitext(osp.basename(item['lq_path']))[0]
        lq, gt = item['lq'].unsqueeze(0).to(device), item['gt'].unsqueeze(0)
        check_crop_border('test.crop_border', test_opt['crop_border'], 'calculate_ssim', stem, gt.shape[-1], gt.shape[-2])
        results = {}
        for entry, network in zip(checkpoints, networks):
            if network is None:
                sr = bicubic_upscale(lq, scale).cpu()
            else:
                sr = run_inference(network, lq, scale, test_opt['inference']).cpu()
            results[entry['label']] = sr
            values = evaluate_image(sr, gt, test_opt['crop_border'], test_opt['test_y_channel'])
            per_image[entry['label']].append({'camera': item['camera'], 'image': stem, **values})
            if test_opt['save_img']:
                folder = osp.join(opt['path']['visualization'], entry['label'], item['camera'])
                imwrite(tensor2img(sr), osp.join(folder, f'{stem}.png'))
        if comparison is not None:
            comparison.write(osp.join(opt['path']['results_root'], 'compare'), item, stem, results, scale, test_opt)
    tables = OrderedDict((label, summarise(rows)) for label, rows in per_image.items())
    measured = measured_as(test_opt)
    text = format_table(tables, markdown=False) + '\n' + measurement_line(measured)
    _to_log_file(logger, '\n' + text, logging.INFO)
    print(text, flush=True)
    write_results(opt['path']['results_root'], tables, per_image, measured)
    logger.info(f"Results written to {opt['path']['results_root']}")
    return tables
