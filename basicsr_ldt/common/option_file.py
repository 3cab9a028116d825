"""Reading option files: plain YAML only, checked against the schema before anything runs.

BasicSR 1.4.2's ``parse_options`` reads the file with PyYAML's full ``Loader``, which builds any
Python object a tag names: ``!!python/object/apply:os.system [...]`` in a shared option file runs
that command. It also raises a ``KeyError`` traceback for a file without ``num_gpu``, ``path`` or
``datasets`` and says nothing about keys it does not read. Every entry point therefore reads option
files through :func:`load_option_file` (PyYAML's safe constructors: mappings, lists, strings,
numbers, booleans, null, dates; mappings as ``dict``, which keeps the file's order as BasicSR's
``OrderedDict`` loader does) and, for ``Train_pip.py`` and ``test.py``, :func:`parse_options`,
which does what BasicSR's ``parse_options`` does (same flags, same ``opt``) after the file passed
:func:`basicsr_ldt.common.schema.check_options`.
"""
import argparse
import ast
import os
import random
from collections.abc import Hashable
from typing import Any, Dict, List, Optional, Tuple

import torch
import yaml

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.flags import FlagParser
from basicsr_ldt.common.schema import TEST, TRAIN, apply_defaults, check_options, describe_file

_SafeLoader = getattr(yaml, 'CSafeLoader', yaml.SafeLoader)   # libyaml when PyYAML has it: faster, same result


class PlainLoader(_SafeLoader):
    """PyYAML's safe loader with two refusals: a tag that would build a Python object (or any tag it
    has no plain constructor for), and a key given twice in one mapping (PyYAML keeps the last
    silently: ``val:`` written twice would drop the first block without a word)."""


def _tag_name(tag: str) -> str:
    prefix = 'tag:yaml.org,2002:'
    return '!!' + tag[len(prefix):] if tag.startswith(prefix) else tag


def _refuse_tag(loader: PlainLoader, node: yaml.Node) -> None:
    raise yaml.constructor.ConstructorError(
        None, None, f"tag '{_tag_name(node.tag)}' would build a Python object (BasicSR's loader runs it); option files hold "
        'plain YAML values only (mappings, lists, strings, numbers, true/false, null)',
        node.start_mark)


def _mapping(loader: PlainLoader, node: yaml.MappingNode) -> Dict[Any, Any]:
    loader.flatten_mapping(node)   # YAML merge keys (<<: *anchor) as the safe loader does them
    result: Dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(None, None, f'a key must be a plain value, got {key!r}',
                                                    key_node.start_mark)
        if key in result:
            raise yaml.constructor.ConstructorError(None, None, f"key '{key}' is given twice in the same mapping",
                                                    key_node.start_mark)
        result[key] = loader.construct_object(value_node, deep=True)
    return result


PlainLoader.add_constructor(None, _refuse_tag)
PlainLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def parse_yaml(text: str, name: str) -> Any:
    """The plain value of a YAML document; a problem is one line naming ``name`` and the line."""
    try:
        return yaml.load(text, Loader=PlainLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f'{name}, line {mark.line + 1}' if mark is not None else name
        problem = ' '.join(str(err.problem or err.context or err).split())
        raise InputError(f'{where}: {problem}') from None
    except yaml.YAMLError as err:
        raise InputError(f"{name}: not valid YAML: {' '.join(str(err).split())}") from None


def load_option_file(path: str, what: str = 'option file') -> Dict[str, Any]:
    """An option file's mapping; a missing, unreadable, empty or non-mapping file, a Python tag or a
    key given twice is an :class:`InputError` of one line naming the file (and the line)."""
    name = f"{what} '{os.path.normpath(path)}'"
    if not os.path.isfile(path):
        raise InputError(f'{name} does not exist')
    try:
        with open(path, encoding='utf-8') as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f'{name}: cannot read it: {getattr(err, "strerror", None) or err}') from None
    data = parse_yaml(text, name)
    if data is None:
        raise InputError(f'{name} is empty: expected a YAML mapping of options (name, model_type, datasets, '
                         'network_g, ...)')
    if not isinstance(data, dict):
        raise InputError(f'{name} holds a {type(data).__name__}, expected a YAML mapping of options '
                         '(name, model_type, datasets, network_g, ...)')
    return data


def _forced_value(text: str) -> Any:
    """A ``--force_yml`` value as BasicSR reads it (``~``/none, true/false, ``!!float``, numbers,
    ``[...]`` lists, else a string), lists parsed as literals instead of by ``eval``, and negative
    numbers as numbers."""
    lowered = text.lower()
    if text == '~' or lowered == 'none':
        return None
    if lowered in ('true', 'false'):
        return lowered == 'true'
    if text.startswith('!!float'):
        return float(text.replace('!!float', ''))
    digits = text[1:] if text.startswith('-') else text   # BasicSR left -1 (warmup_iter: none) as text
    if digits.isdigit():
        return int(text)
    if digits.replace('.', '', 1).isdigit():
        return float(text)
    if text.startswith('['):
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise InputError(f'--force_yml: {text!r} is not a list of plain values') from None
    return text


def force_options(opt: Dict[str, Any], entries: Optional[List[str]]) -> None:
    """``--force_yml train:total_iter=10 ...``: set keys (``:`` between levels) before the check."""
    for entry in entries or []:
        if '=' not in entry:
            raise InputError(f"--force_yml: expected key:subkey=value, got '{entry}'")
        keys, value = (part.strip() for part in entry.split('=', 1))
        section = opt
        parts = keys.split(':')
        for depth, key in enumerate(parts[:-1]):
            section = section.get(key) if isinstance(section, dict) else None
            if not isinstance(section, dict):
                raise InputError(f"--force_yml {entry}: the option file has no section '{'.'.join(parts[:depth + 1])}'")
        section[parts[-1]] = _forced_value(value)


def argument_parser(command: str) -> argparse.ArgumentParser:
    """BasicSR 1.4.2's flags, unchanged (``Train_pip.py -h``); a bad one is one ``error:`` line."""
    parser = FlagParser(command)
    parser.add_argument('-opt', type=str, required=True, help='Path to option YAML file.')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm'], default='none', help='job launcher')
    parser.add_argument('--auto_resume', action='store_true')
    parser.add_argument('--debug', action='store_true')
    parser.add_argument('--local_rank', type=int, default=0)
    parser.add_argument('--force_yml', nargs='+', default=None,
                        help='Force to update yml files. Examples: train:ema_decay=0.999')
    return parser


def read_checked_options(path: str, role: str, forced: Optional[List[str]] = None) -> Tuple[Dict[str, Any], Optional[str]]:
    """Load, force and check an option file for ``role``; the options with their defaults filled in,
    and the log line naming those defaults (None when the file gave every key)."""
    opt = load_option_file(path)
    force_options(opt, forced)
    defaults = check_options(opt, role, describe_file(path))
    return opt, apply_defaults(defaults)


def check_gpu_count(num_gpu: Any) -> None:
    """A ``num_gpu`` this machine has (training: BasicSR moves the network to CUDA for any count but 0,
    a traceback from deep in the model's setup otherwise; test.py ran on the CPU without a word)."""
    present = torch.cuda.device_count()
    if num_gpu != 'auto' and num_gpu > present:
        there = f'{present} CUDA device{"s" if present != 1 else ""}' if present else 'no CUDA device'
        raise InputError(f"num_gpu: {num_gpu}, but torch sees {there} here; expected at most {present} "
                         f"('auto' takes what there is{', 0 the CPU' if present else ': the CPU'})")


def _start_launcher(launcher: str, opt: Dict[str, Any]) -> None:
    """Start the process group ``--launcher`` asks for (after the options were checked)."""
    if launcher == 'pytorch':
        import torch.distributed as dist
        from basicsr_ldt.common.process_group import start_process_group
        missing = [name for name in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT') if name not in os.environ]
        if missing and not (dist.is_available() and dist.is_initialized()):
            raise InputError(f"--launcher pytorch: {', '.join(missing)} not set, as torchrun sets them; start the "
                             'run with torchrun --nproc_per_node=N ... --launcher pytorch, or drop --launcher')
        if not (dist.is_available() and dist.is_initialized()):
            start_process_group()
    elif launcher == 'slurm':
        from basicsr.utils.dist_util import init_dist
        missing = [name for name in ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_NODELIST') if name not in os.environ]
        if missing or not torch.cuda.is_available():
            raise InputError('--launcher slurm: ' + (f"{', '.join(missing)} not set, as srun sets them; start the run "
                                                     'with srun, or drop --launcher' if missing else
                                                     'BasicSR starts one process per GPU, and torch sees no CUDA '
                                                     'device; use --launcher pytorch with torchrun on a CPU'))
        init_dist('slurm', **(opt.get('dist_params') or {}))


def parse_options(root_path: str, is_train: bool = True) -> Tuple[Dict[str, Any], argparse.Namespace]:
    """BasicSR's ``parse_options`` (same flags, same ``opt``, same output paths under ``root_path``)
    with the file read plain and checked first, and ``--launcher pytorch`` on CPU machines too.

    ``args.option_defaults`` is the log line naming the defaults filled in (or None)."""
    from basicsr.utils import set_random_seed
    from basicsr.utils.dist_util import get_dist_info
    args = argument_parser('python Train_pip.py' if is_train else 'python test.py').parse_args()
    opt, args.option_defaults = read_checked_options(args.opt, TRAIN if is_train else TEST, args.force_yml)
    check_gpu_count(opt.get('num_gpu', 'auto'))   # test.py too: it ran on the CPU without a word

    _start_launcher(args.launcher, opt)
    opt['dist'] = args.launcher != 'none'
    opt['rank'], opt['world_size'] = get_dist_info()
    if opt.get('manual_seed') is None:
        opt['manual_seed'] = random.randint(1, 10000)
    set_random_seed(opt['manual_seed'] + opt['rank'])
    opt['auto_resume'], opt['is_train'] = args.auto_resume, is_train
    if args.debug and not opt['name'].startswith('debug'):
        opt['name'] = 'debug_' + opt['name']
    if opt['num_gpu'] == 'auto':
        opt['num_gpu'] = torch.cuda.device_count()

    for section, dataset in opt['datasets'].items():
        dataset['phase'] = section.split('_')[0]     # val_1, val_2: phase 'val'
        if 'scale' in opt:
            dataset['scale'] = opt['scale']
        for key in ('dataroot_gt', 'dataroot_lq'):
            if dataset.get(key) is not None:
                dataset[key] = os.path.expanduser(dataset[key])
    paths = opt['path']
    for key, value in paths.items():
        if value is not None and ('resume_state' in key or 'pretrain_network' in key):
            paths[key] = os.path.expanduser(value)

    if is_train:
        root = os.path.join(root_path, 'experiments', opt['name'])
        paths.update(experiments_root=root, models=os.path.join(root, 'models'), log=root,
                     training_states=os.path.join(root, 'training_states'),
                     visualization=os.path.join(root, 'visualization'))
        if 'debug' in opt['name']:     # BasicSR's debug mode: validate, print and save often, no tensorboard
            if not opt['name'].startswith('debug'):
                raise InputError(f"name '{opt['name']}' contains 'debug', which turns on BasicSR's debug mode "
                                 '(validation and checkpoints every 8 iterations, printing every one, no tensorboard); '
                                 "expected a name starting with 'debug' for that mode (or --debug), else one without "
                                 'the word')
            if opt.get('val') is not None:
                opt['val']['val_freq'] = 8
            opt['logger'].update(print_freq=1, save_checkpoint_freq=8)
    else:
        root = os.path.join(root_path, 'results', opt['name'])
        paths.update(results_root=root, log=root, visualization=os.path.join(root, 'visualization'))
    return opt, args
