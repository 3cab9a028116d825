"""Checkpoint files are replaced atomically and read safely."""
import os

import pytest
import torch

from basicsr_ldt import checkpoint
from basicsr_ldt.checkpoint import load_safe, load_weights, save_atomic
from basicsr_ldt.errors import InputError


def test_failed_write_leaves_previous_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / 'net_g_10.pth'
    save_atomic({'params': {'w': torch.ones(2)}}, str(path))
    before = path.read_bytes()

    def dies_mid_write(obj, stream):
        stream.write(b'partial')
        raise KeyboardInterrupt  # e.g. the job is stopped while writing

    monkeypatch.setattr(checkpoint.torch, 'save', dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        save_atomic({'params': {'w': torch.zeros(2)}}, str(path))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ['net_g_10.pth']


def test_truncated_checkpoint_is_named(tmp_path):
    path = tmp_path / 'net_g_latest.pth'
    save_atomic({'params': {'w': torch.ones(100)}}, str(path))
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(InputError, match="cannot read checkpoint '.*net_g_latest.pth'"):
        load_safe(str(path))


def test_params_ema_fallback_and_module_prefix(tmp_path):
    net = torch.nn.Linear(2, 2)
    path = tmp_path / 'x.pth'
    torch.save({'params': {f'module.{k}': v for k, v in net.state_dict().items()}}, path)
    fresh = torch.nn.Linear(2, 2)
    load_weights(fresh, str(path), param_key='params_ema')
    assert torch.equal(fresh.weight, net.weight)
