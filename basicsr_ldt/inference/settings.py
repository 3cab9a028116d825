"""How a network runs on whole photographs: one set of keys for ``test:``, ``val:``, ``upscale()``
and ``inference.py``.

Validation during training and ``test.py`` must measure the same thing, and a user running their
own photos gets the same choice with the same checks, so all four read the same keys through
:func:`inference_settings` and run :func:`basicsr_ldt.inference.tiling.run_inference`:

- ``tile_mode``: ``official`` (the LDT code's ``SR_slice``: ``n // 200 + 1`` sections per axis,
  10% overlap; what the paper's numbers were measured with), ``fixed`` (square tiles of
  ``tile_size`` LR pixels overlapping by ``tile_overlap``) or ``whole`` (whole images). Default (also
  for ``null``): ``fixed`` when ``tile_size`` > 0, else ``whole`` (what these keys meant before
  ``tile_mode``). Not ``none``: BasicSR's ``--force_yml`` turns that word into null.
- ``precision``: ``fp32``, ``bf16`` or ``fp16`` (autocast; fp16 on CUDA only).
"""
from dataclasses import dataclass
from typing import Mapping, Optional

import torch

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.ldt.precision import INFERENCE_DTYPES, resolve_dtype
from basicsr_ldt.ldt.typed import check_options, choice, integer, optional

TILE_MODES = ('official', 'fixed', 'whole')
#: The inference keys of ``test:`` and ``val:`` and their defaults (``tile_mode``: see above).
INFERENCE_DEFAULTS = {'tile_mode': None, 'tile_size': 0, 'tile_overlap': 16, 'precision': 'fp32'}
INFERENCE_SPECS = {'tile_mode': optional(choice(*TILE_MODES)), 'tile_size': integer(0), 'tile_overlap': integer(0),
                   'precision': choice(*INFERENCE_DTYPES)}


@dataclass(frozen=True)
class InferenceSettings:
    tile_mode: str
    tile_size: int
    tile_overlap: int
    precision: str
    dtype: Optional[torch.dtype]   # the autocast dtype ``precision`` names (None: fp32)

    def describe(self) -> str:
        """One phrase for the log: how images are cut and in which precision."""
        cut = {'official': 'official LDT sections (n // 200 + 1 per axis, 10% overlap)',
               'fixed': f'{self.tile_size}-pixel tiles overlapping by {self.tile_overlap}',
               'whole': 'whole images'}[self.tile_mode]
        return f'{cut}, {self.precision}'


def inference_settings(section: Optional[str], given: Optional[Mapping], device_type: str,
                       flags: bool = False) -> InferenceSettings:
    """The inference keys of ``given`` with defaults, refusing a bad value with one line naming the key.

    ``given`` is the ``test`` or ``val`` section (other keys are the caller's), or the same keys as
    :func:`basicsr_ldt.inference.api.upscale` keywords or ``inference.py`` flags: one check and one
    wording wherever a user chooses how images are run. Each key is named as that user wrote it:
    ``<section>.<key>`` (``val.tile_size``); with ``section`` None the bare keyword (``tile_size``),
    with ``flags`` as well the command-line flag (``--tile-size``). A keyword or flag that is None
    takes its default.
    """
    short = (lambda key: '--' + key.replace('_', '-')) if flags else (lambda key: key)
    name = (lambda key: f'{section}.{short(key)}') if section else short
    given = {k: v for k, v in (given or {}).items() if k in INFERENCE_DEFAULTS}
    specs = INFERENCE_SPECS
    if not section:   # a keyword or flag left at None is not given (YAML has null for that): no null to offer
        given = {k: v for k, v in given.items() if v is not None}
        specs = {**INFERENCE_SPECS, 'tile_mode': choice(*TILE_MODES)}
    check_options(section or '', given, specs, InputError, name, yaml=bool(section))
    values = {**INFERENCE_DEFAULTS, **given}
    mode = values['tile_mode'] or ('fixed' if values['tile_size'] else 'whole')
    if mode == 'fixed' and not values['tile_size']:
        raise InputError(f"{name('tile_size')}: {short('tile_mode')} 'fixed' needs the tile size in LR pixels "
                         f"(an integer >= 1), got {values['tile_size']!r}")
    for key in ('tile_size', 'tile_overlap'):   # a tile the mode never cuts: the user meant another mode
        if mode != 'fixed' and values[key] != INFERENCE_DEFAULTS[key]:
            raise InputError(f"{name(key)}: only {short('tile_mode')} 'fixed' uses it ({short('tile_mode')} is "
                             f"{mode!r}); remove it or set it to {INFERENCE_DEFAULTS[key]}")
    if mode == 'fixed' and values['tile_overlap'] >= values['tile_size']:
        raise InputError(f"{name('tile_overlap')}: expected an integer in [0, {short('tile_size')}="
                         f"{values['tile_size']}), got {values['tile_overlap']}")
    try:
        dtype = resolve_dtype(name('precision'), values['precision'], INFERENCE_DTYPES, device_type)
    except ValueError as err:
        raise InputError(str(err)) from None
    return InferenceSettings(mode, values['tile_size'], values['tile_overlap'], values['precision'], dtype)
