"""Which camera took an image, and which pairs of a DRealSR-style folder belong together.

DRealSR ships one flat folder per split; the camera is only visible in the file name
(``DSC_1412_x1.png``, ``IMG_0031_x1.png``, ``P1010042_x1.png`` ...). Users who reorganised the data
keep one subfolder per camera instead. A :class:`CameraRule` covers both, so choosing source and
target cameras is a matter of listing names in the YAML.
"""
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

from basicsr_ldt.errors import InputError

#: The six camera branches the LDT paper reports on DRealSR (Table 1).
DREALSR_CAMERAS = ('Olympus', 'Pan', 'Sony', 'DSC', 'IMG', 'Canon')

#: Leading letters of the file stem: ``DSC_1412`` -> ``DSC``, ``P1010042`` -> ``P``.
DEFAULT_CAMERA_PATTERN = r'^(?P<camera>[A-Za-z]+)'

#: Spellings seen for the same branch, mapped to the paper's branch names.
DEFAULT_CAMERA_ALIASES = {
    'P': 'Pan',
    'Panasonic': 'Pan',
    'panasonic': 'Pan',
    'olympus': 'Olympus',
    'sony': 'Sony',
    'SONY': 'Sony',
    'canon': 'Canon',
    'CANON': 'Canon',
}

IMAGE_EXTENSIONS = ('.png', '.jpg', '.jpeg', '.bmp', '.tif', '.tiff', '.webp')


@dataclass
class CameraRule:
    """Maps an image's path (relative to its data root, without extension) to a camera name.

    ``source``: ``folder`` takes the first directory of the relative path, ``filename`` applies
    ``pattern`` (a regex with a ``camera`` group, or the whole match) to the file stem, and
    ``auto`` uses the folder when there is one and the file name otherwise.
    """
    source: str = 'auto'
    pattern: str = DEFAULT_CAMERA_PATTERN
    aliases: Dict[str, str] = field(default_factory=lambda: dict(DEFAULT_CAMERA_ALIASES))

    def __post_init__(self) -> None:
        if self.source not in ('auto', 'folder', 'filename'):
            raise InputError(f"camera_rule.source must be one of auto, folder, filename; got '{self.source}'")
        try:
            self._regex = re.compile(self.pattern)
        except re.error as err:
            raise InputError(f"camera_rule.pattern '{self.pattern}' is not a valid regular expression: {err}")

    @classmethod
    def from_options(cls, opt: Optional[Mapping]) -> 'CameraRule':
        """Build from the ``camera_rule`` option; given aliases extend the defaults."""
        if opt is None:
            return cls()
        from basicsr_ldt.options import check_known_keys
        check_known_keys('camera_rule', opt, ('source', 'pattern', 'aliases'))
        aliases = dict(DEFAULT_CAMERA_ALIASES)
        aliases.update(opt.get('aliases') or {})
        return cls(source=opt.get('source', 'auto'), pattern=opt.get('pattern', DEFAULT_CAMERA_PATTERN),
                   aliases=aliases)

    def camera_of(self, key: str) -> str:
        """Camera of ``key``, a relative path without extension using '/' separators."""
        parts = key.split('/')
        if self.source == 'folder' or (self.source == 'auto' and len(parts) > 1):
            if len(parts) < 2:
                raise InputError(f"camera_rule.source is 'folder' but '{key}' is not inside a camera subfolder")
            name = parts[0]
        else:
            match = self._regex.search(parts[-1])
            if match is None:
                raise InputError(f"cannot tell the camera of '{key}': camera_rule.pattern '{self.pattern}' "
                                 'does not match its file name')
            name = match.groupdict().get('camera') or match.group(0)
        return self.aliases.get(name, name)


def list_images(root: str) -> List[str]:
    """Relative paths (with '/' separators) of every image below ``root``, sorted."""
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            if name.lower().endswith(IMAGE_EXTENSIONS):
                found.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, '/'))
    return sorted(found)


def strip_template(key: str, template: str) -> Optional[str]:
    """Inverse of ``template.format(stem)`` applied to the file-name part of ``key``.

    ``strip_template('Sony/DSC_1_x4', '{}_x4') == 'Sony/DSC_1'``; ``None`` when it does not fit.
    """
    head, _, name = key.rpartition('/')
    prefix, _, suffix = template.partition('{}')
    if not (name.startswith(prefix) and name.endswith(suffix)) or len(name) <= len(prefix) + len(suffix):
        return None
    stem = name[len(prefix):len(name) - len(suffix)]
    return f'{head}/{stem}' if head else stem


def pair_keys(gt_keys: Iterable[str], lq_keys: Iterable[str], gt_template: str, lq_template: str,
              where: str) -> List[tuple]:
    """Match HR and LR images by stem; every image must have exactly one partner.

    Returns ``(stem, gt_key, lq_key)`` sorted by stem. An unpaired file is an error rather than
    a silently smaller dataset, because a half-copied download would otherwise go unnoticed.
    """
    def by_stem(keys: Iterable[str], template: str, side: str) -> Dict[str, str]:
        stems = {}
        for key in keys:
            stem = strip_template(key, template)
            if stem is None:
                raise InputError(f"{side} image '{key}' in {where} does not follow the naming "
                                 f"template '{template}' (e.g. {template.format('DSC_1412')}.png)")
            stems[stem] = key
        return stems

    gt, lq = by_stem(gt_keys, gt_template, 'HR'), by_stem(lq_keys, lq_template, 'LR')
    missing_lq, missing_gt = sorted(set(gt) - set(lq)), sorted(set(lq) - set(gt))
    if missing_lq or missing_gt:
        lines = []
        if missing_lq:
            lines.append(f"{len(missing_lq)} HR image(s) without an LR partner, e.g. '{gt[missing_lq[0]]}'")
        if missing_gt:
            lines.append(f"{len(missing_gt)} LR image(s) without an HR partner, e.g. '{lq[missing_gt[0]]}'")
        raise InputError(f"unpaired files in {where}: {'; '.join(lines)}")
    return [(stem, gt[stem], lq[stem]) for stem in sorted(gt)]


def select_cameras(cameras_of: Sequence[str], wanted: Optional[Sequence[str]], where: str) -> List[int]:
    """Indices of the entries whose camera is in ``wanted`` (``None`` or 'all' keeps all)."""
    counts = Counter(cameras_of)
    if wanted is None or wanted == 'all' or wanted == ['all']:
        return list(range(len(cameras_of)))
    if isinstance(wanted, str):
        wanted = [wanted]
    unknown = [c for c in wanted if c not in counts]
    if unknown:
        found = ', '.join(f'{name} ({count})' for name, count in sorted(counts.items()))
        raise InputError(f"unknown camera(s) {', '.join(map(repr, unknown))} in {where}; "
                         f"cameras found (images): {found or 'none'}")
    keep = set(wanted)
    return [i for i, camera in enumerate(cameras_of) if camera in keep]


def camera_counts(cameras_of: Iterable[str]) -> Dict[str, int]:
    """Number of images per camera, in name order (for reports and error messages)."""
    return dict(sorted(Counter(cameras_of).items()))
