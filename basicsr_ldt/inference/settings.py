"""How a network runs on whole test photographs: one set of keys for ``test:`` and ``val:``.

Validation during training and ``test.py`` must measure the same thing, so both read the same
keys through :func:`inference_settings` and run :func:`basicsr_ldt.inference.tiling.run_inference`:

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


def inference_settings(section: str, given: Optional[Mapping], device_type: str) -> InferenceSettings:
    """The inference keys of ``given`` (the ``test`` or ``val`` section; other keys are the
    caller's) with defaults, refusing a bad value with one line naming ``<section>.<key>``."""
    given = {k: v for k, v in (given or {}).items() if k in INFERENCE_DEFAULTS}
    check_options(section, given, INFERENCE_SPECS, InputError)
    values = {**INFERENCE_DEFAULTS, **given}
    mode = values['tile_mode'] or ('fixed' if values['tile_size'] else 'whole')
    if mode == 'fixed' and not values['tile_size']:
        raise InputError(f"{section}.tile_size: tile_mode 'fixed' needs the tile size in LR pixels (an integer >= 1), "
                         f"got {values['tile_size']!r}")
    if mode != 'fixed' and values['tile_size']:
        raise InputError(f"{section}.tile_size: only tile_mode 'fixed' uses it (tile_mode is {mode!r}); remove it or "
                         'set it to 0')
    if mode == 'fixed' and values['tile_overlap'] >= values['tile_size']:
        raise InputError(f"{section}.tile_overlap: expected an integer in [0, tile_size={values['tile_size']}), "
                         f"got {values['tile_overlap']}")
    try:
        dtype = resolve_dtype(f'{section}.precision', values['precision'], INFERENCE_DTYPES, device_type)
    except ValueError as err:
        raise InputError(str(err)) from None
    return InferenceSettings(mode, values['tile_size'], values['tile_overlap'], values['precision'], dtype)
