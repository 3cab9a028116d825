"""Which camera took an image, and which pairs of a DRealSR folder belong together.

Facts about the published DRealSR x4 that this module is written to (public file lists of the
release: github lonelyhope/DADA ``image_list/test.csv`` and ``train.csv``; the official LDT code,
github ZaizuoTang/LDT ``Train_pip.py``):

- one flat folder per split and side: ``Train_x4/train_HR``, ``train_LR``, ``Test_x4/test_HR``,
  ``test_LR``. The ``_x<n>`` token in a name is the zoom the shot was taken at, not its role: a test
  pair is HR ``Canon_10_x4.png`` with LR ``Canon_10_x1.png``; the training split is pre-cut patches
  ``panasonic_141_x4_28.png`` (``<stem>_x<zoom>_<k>``, patch index ``k``). So a pair is matched
  by (stem, patch index) whatever the zoom token, and HR/LR is decided by the folder.
- the camera is the file name's leading letters: ``P1140279`` (Olympus, P + month + day + number),
  ``panasonic_158``, ``sony_116``, ``DSC_1265`` (Nikon), ``IMG_140``, ``Canon_56``; test counts
  19 / 20 / 17 / 20 / 12 / 5 (93 pairs).
- the official LDT code reads per-camera folders ``Train/LR/P`` (its source camera, Olympus),
  ``panasonic``, ``sony``, ``DSC``, ``IMG``, ``Canon``.

A :class:`CameraRule` covers both layouts and maps those prefixes and folders to the LDT paper's
six branch names, so choosing source and target cameras is a matter of listing names in the YAML.
"""
import logging
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from basicsr_ldt.common.errors import InputError

#: The six camera branches the LDT paper reports on DRealSR (Table 1).
DREALSR_CAMERAS = ('Olympus', 'Pan', 'Sony', 'DSC', 'IMG', 'Canon')

#: Leading letters of the file stem: ``DSC_1265`` -> ``DSC``, ``P1140279`` -> ``P``.
DEFAULT_CAMERA_PATTERN = r'^(?P<camera>[A-Za-z]+)'

#: DRealSR's file prefixes and the official code's folder names, plus other spellings of the same
#: branches, mapped to the paper's branch names. ``P`` is Olympus (the paper's source camera).
DEFAULT_CAMERA_ALIASES = {
    'P': 'Olympus',
    'olympus': 'Olympus',
    'panasonic': 'Pan',
    'Panasonic': 'Pan',
    'sony': 'Sony',
    'SONY': 'Sony',
    'Nikon': 'DSC',
    'nikon': 'DSC',
    'canon': 'Canon',
    'CANON': 'Canon',
    # Not in DRealSR: the demo's pretraining camera, whose pairs each draw their own degradation
    # from the demo camera family's ranges (scripts/make_demo_data.py, Mix_<nnn> files).
    'Mix': 'Mix',
    # Not in DRealSR: the demo's classic-SR pretraining pairs (no degradation, x4 area resize;
    # scripts/make_demo_data.py, Clean_<nnn> files).
    'Clean': 'Clean',
}

IMAGE_EXTENSIONS = ('.png', '.jpg', '.jpeg', '.bmp', '.tif', '.tiff', '.webp')

#: ``<stem>_x<zoom>`` or ``<stem>_x<zoom>_<k>``: DRealSR's names for whole images and patches (and
#: ``_<k>_<j>`` for sub-image ``j`` that ``prepare_drealsr.py --crop`` cut from patch ``k``).
_DREALSR_NAME = re.compile(r'^(?P<stem>.+?)_x(?P<zoom>\d+)(?P<patch>(?:_\d+)*)$')


@dataclass
class CameraRule:
    """Maps an image's path (relative to its data root, without extension) to a camera name.

    ``source``: ``folder`` takes the first directory of the relative path, ``filename`` applies
    ``pattern`` (a regex with a ``camera`` group, or the whole match) to the file stem, and
    ``auto`` uses the folder when there is one and the file name otherwise. A name is looked up
    in ``aliases``; with the default pattern a file prefix that is neither one of the six DRealSR
    cameras nor an alias target stops the run (:meth:`cameras_of`), because a stray file would
    otherwise become a camera of its own.
    """
    source: str = 'auto'
    pattern: str = DEFAULT_CAMERA_PATTERN
    aliases: Dict[str, str] = field(default_factory=lambda: dict(DEFAULT_CAMERA_ALIASES))
    #: The aliases the option file gave (not the defaults): one that names no folder or prefix found is
    #: most likely misspelt, and its images then carry the unaliased name.
    given: Tuple[str, ...] = ()

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
        from basicsr_ldt.common.options import check_known_keys
        check_known_keys('camera_rule', opt, ('source', 'pattern', 'aliases'))
        aliases = dict(DEFAULT_CAMERA_ALIASES)
        aliases.update(opt.get('aliases') or {})
        return cls(source=opt.get('source', 'auto'), pattern=opt.get('pattern', DEFAULT_CAMERA_PATTERN),
                   aliases=aliases, given=tuple(opt.get('aliases') or {}))

    @property
    def known_cameras(self) -> set:
        """Camera names a default-pattern prefix may map to: DRealSR's six and every alias target."""
        return set(DREALSR_CAMERAS) | set(self.aliases.values())

    def _from_filename(self, key: str) -> Optional[str]:
        match = self._regex.search(key.split('/')[-1])
        if match is None:
            return None
        return match.groupdict().get('camera') or match.group(0)

    def label_of(self, key: str) -> Tuple[str, str]:
        """(raw label, where it came from: 'folder' or 'prefix') of ``key``, before aliases."""
        parts = key.split('/')
        if self.source == 'folder' or (self.source == 'auto' and len(parts) > 1):
            if len(parts) < 2:
                raise InputError(f"camera_rule.source is 'folder' but '{key}' is not inside a camera subfolder")
            return parts[0], 'folder'
        name = self._from_filename(key)
        if name is None:
            raise InputError(f"cannot tell the camera of '{key}': camera_rule.pattern '{self.pattern}' "
                             'does not match its file name')
        return name, 'prefix'

    def camera_of(self, key: str) -> str:
        """Camera of ``key``, a relative path without extension using '/' separators."""
        label, _ = self.label_of(key)
        return self.aliases.get(label, label)

    def cameras_of(self, keys: Sequence[str], where: str) -> List[str]:
        """Camera of every key, after checking the whole folder at once.

        Stops with one line when a default-pattern prefix maps to no known camera (listing every
        prefix found, its image count and the camera it maps to), or when a file inside a camera
        folder carries another camera's prefix (``Olympus/sony_1_x4``: which one is meant?).
        """
        labels = [self.label_of(key) for key in keys]
        cameras = [self.aliases.get(label, label) for label, _ in labels]
        found = {label for label, _ in labels}
        unused = [alias for alias in self.given if alias not in found]
        if unused:
            logging.getLogger('basicsr').warning(
                f"camera_rule.aliases {', '.join(map(repr, unused))} name(s) no camera folder or file prefix in "
                f"{where} (found: {', '.join(sorted(found))}); check the spelling")
        if self.pattern == DEFAULT_CAMERA_PATTERN:
            from_prefix = [(label, camera) for (label, source), camera in zip(labels, cameras) if source == 'prefix']
            unknown = sorted({label for label, camera in from_prefix if camera not in self.known_cameras})
            if unknown:
                counts = Counter(label for label, _ in from_prefix)
                mapped = dict(from_prefix)
                found = ', '.join(f"{label} ({counts[label]} -> "
                                  f"{mapped[label] if mapped[label] in self.known_cameras else '?'})"
                                  for label in sorted(counts))
                example = next(key for key, (label, _) in zip(keys, labels) if label == unknown[0])
                raise InputError(f"unknown camera prefix(es) {', '.join(map(repr, unknown))} in {where} "
                                 f"(e.g. '{example}'); prefixes found (images -> camera): {found}. Expected "
                                 f"DRealSR's P, panasonic, sony, DSC, IMG, Canon; name others with "
                                 f"camera_rule.aliases (e.g. {{{unknown[0]}: {unknown[0]}}})")
            drealsr = set(DREALSR_CAMERAS)
            for key, (label, source), camera in zip(keys, labels, cameras):
                if source != 'folder':
                    continue
                named = self._from_filename(key)
                by_name = self.aliases.get(named, named) if named else None
                if by_name in drealsr and by_name != camera and camera in drealsr:
                    raise InputError(f"'{key}' in {where} is in camera folder '{label}' ({camera}) but its "
                                     f"name says {by_name}: move it or rename it")
        return cameras


def list_images(root: str) -> List[str]:
    """Relative paths (with '/' separators) of every image below ``root``, sorted."""
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            if name.lower().endswith(IMAGE_EXTENSIONS):
                found.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, '/'))
    return sorted(found)


def split_extension(name: str) -> Tuple[str, str]:
    """(name without an image extension, the extension or '')."""
    root, ext = os.path.splitext(name)
    return (root, ext) if ext.lower() in IMAGE_EXTENSIONS else (name, '')


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


def drealsr_name_parts(name: str) -> Optional[Tuple[str, str, str]]:
    """(stem, zoom, patch suffix) of a file name without extension under DRealSR's naming:
    ``panasonic_141_x4_28`` -> ``('panasonic_141', '4', '_28')``; ``None`` without a zoom token."""
    match = _DREALSR_NAME.match(name)
    return (match['stem'], match['zoom'], match['patch']) if match else None


def drealsr_pair_key(key: str) -> str:
    """The name shared by an HR image and its LR partner under DRealSR's naming.

    ``Canon_10_x4`` and ``Canon_10_x1`` -> ``Canon_10``; patches ``panasonic_141_x4_28`` and
    ``panasonic_141_x1_28`` -> ``panasonic_141_28``. The zoom token is dropped because it names the
    shot, not the role (the project's earlier names, HR ``_x1`` / LR ``_x4``, pair the same way);
    a name without one is its own key (identical names in both folders, BasicSR's default).
    """
    head, _, name = key.rpartition('/')
    parts = drealsr_name_parts(name)
    if parts:
        name = parts[0] + parts[2]
    return f'{head}/{name}' if head else name


def pair_keys(gt_keys: Iterable[str], lq_keys: Iterable[str], gt_template: Optional[str],
              lq_template: Optional[str], where: str) -> List[tuple]:
    """Match HR and LR images; every image must have exactly one partner.

    ``gt_keys``/``lq_keys`` are relative paths, with or without an image extension. With both
    templates ``None`` pairs follow DRealSR's naming (:func:`drealsr_pair_key`); otherwise a key
    must fit its side's template (``filename_tmpl_gt: '{}_HR'``). Returns ``(stem, gt_key,
    lq_key)`` sorted by stem. An unpaired file or two files for one pair is an error rather than a
    silently smaller or shuffled dataset: a half-copied download would otherwise go unnoticed.
    """
    def by_stem(keys: Iterable[str], template: Optional[str], side: str) -> Dict[str, str]:
        stems: Dict[str, str] = {}
        for key in keys:
            bare, _ = split_extension(key)
            if template is None:
                stem = drealsr_pair_key(bare)
            else:
                stem = strip_template(bare, template)
                if stem is None:
                    raise InputError(f"{side} image '{key}' in {where} does not follow the naming "
                                     f"template '{template}' (e.g. {template.format('Canon_10')}.png)")
            if stem in stems:
                raise InputError(f"two {side} images for one pair '{stem}' in {where}: '{stems[stem]}' and "
                                 f"'{key}' (expected one {side} image per stem and patch index; is the "
                                 f"other side's folder mixed in?)")
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
        rule = ('pairs are matched by stem and patch index, whatever the zoom token: HR '
                "'Canon_10_x4' with LR 'Canon_10_x1', 'sony_26_x4_24' with 'sony_26_x1_24'"
                if gt_template is None else f"templates '{gt_template}' / '{lq_template}'")
        raise InputError(f"unpaired files in {where}: {'; '.join(lines)} ({rule})")
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
