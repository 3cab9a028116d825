"""The upstream released weights the option files start from, by name, and where they come from.

``pretrained/<name>.pth`` is where ``scripts/fetch_weights.py <name>`` puts a release and where the
option files look for it; a checkpoint given as a bare release name (``inference.py --checkpoint
HAT_SRx4``, ``path.pretrain_network_g: HAT_SRx4``) means that file.

Sources are the authors' own: a Hugging Face repository their README links to, downloaded from
``$HF_ENDPOINT`` (default https://huggingface.co; a mirror works the same way). A release that its
authors publish only on Google Drive / Baidu (HAT) has no direct link a program can follow: the
user downloads it by hand into ``pretrained/`` and ``fetch_weights.py`` then checks it and records
its checksum like a downloaded one.
"""
import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from basicsr_ldt.common.errors import InputError

#: Where released weights live: ``<repository>/pretrained`` (this file is ``basicsr_ldt/weights/releases.py``).
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRETRAINED_DIR = os.path.join(REPOSITORY, 'pretrained')

#: Each architecture's classic x4 configuration (the released DF2K/DIV2K SR models: MambaIR
#: ``MambaIR_SR_x4``, HAT ``HAT_SRx4``, SAFMN ``SAFMN_DF2K_x4``); ``scale`` replaces the factor.
ARCH_DEFAULTS: Dict[str, Dict[str, Any]] = {
    'MambaIR': dict(upscale=4, in_chans=3, img_size=64, img_range=1., d_state=16, depths=[6] * 6, embed_dim=180,
                    mlp_ratio=2., upsampler='pixelshuffle', resi_connection='1conv'),
    'HAT': dict(upscale=4, in_chans=3, img_size=64, window_size=16, compress_ratio=3, squeeze_factor=30,
                conv_scale=0.01, overlap_ratio=0.5, img_range=1., depths=[6] * 6, embed_dim=180,
                num_heads=[6] * 6, mlp_ratio=2., upsampler='pixelshuffle', resi_connection='1conv'),
    'SAFMN': dict(dim=36, n_blocks=8, ffn_scale=2.0, upscaling_factor=4),
}


@dataclass(frozen=True)
class Release:
    """One released checkpoint: the network it must load into (strictly) and where to get it."""

    network: Mapping[str, Any]       #: ``network_g`` section of the released configuration
    page: str                        #: where the authors list it
    repo: Optional[str] = None       #: the authors' Hugging Face model repository
    file: Optional[str] = None       #: path of the file in that repository
    manual: Optional[str] = None     #: where to download it by hand, when there is no direct link
    #: The SHA-256 its authors publish (e.g. the Git LFS pointer of a Hugging Face file), pinned here
    #: before any download; ``None``: pinned in ``weights.lock`` at the first download instead.
    sha256: Optional[str] = None
    sha256_source: Optional[str] = None  #: where that published checksum is read

    def url(self, endpoint: str) -> Optional[str]:
        return None if self.repo is None else f"{endpoint.rstrip('/')}/{self.repo}/resolve/main/{self.file}"


def _classic_x4(arch: str) -> Dict[str, Any]:
    return {'type': arch, **ARCH_DEFAULTS[arch]}


def releases() -> Dict[str, Release]:
    """The released x4 models of the option files, by the name they have in ``pretrained/``."""
    return {
        'MambaIR_SR_x4': Release(
            _classic_x4('MambaIR'), 'https://github.com/csguoh/MambaIR#model_summary (MambaIR_SR4, classic SR x4)',
            repo='cguoh/MambaIR', file='MambaIRv1_ckpt/MambaIR_classicSRx4.pth'),
        'HAT_SRx4': Release(
            _classic_x4('HAT'), 'https://github.com/XPixelGroup/HAT#how-to-test (HAT_SRx4.pth)',
            manual='Google Drive https://drive.google.com/drive/folders/1HpmReFfoUqUbnAOQ7rvOeNU3uf_m69w0 or Baidu '
                   'Netdisk https://pan.baidu.com/s/1u2r4Lc2_EEeQqra2-w85Xg (access code qyrl), file HAT_SRx4.pth'),
        'SAFMN_DF2K_x4': Release(
            _classic_x4('SAFMN'), 'https://github.com/sunny2109/SAFMN#pretrained-models-and-results (BI-Efficient SR x4)',
            repo='Meloo/SAFMN', file='SAFMN_DF2K_x4.pth',
            sha256='fe4f38fd6c1e3692bfbc6ab94f44adb815bfb54984b8886547657727af67f49d',
            sha256_source='the Git LFS pointer of SAFMN_DF2K_x4.pth in huggingface.co/Meloo/SAFMN (1,004,953 bytes)'),
    }


def release_name(path: str) -> Optional[str]:
    """The release a checkpoint path or name refers to (``HAT_SRx4``, ``pretrained/HAT_SRx4.pth``)."""
    stem = os.path.basename(path)
    stem = stem[:-len('.pth')] if stem.endswith('.pth') else stem
    return stem if stem in releases() else None


def release_file(path: str) -> Optional[str]:
    """``pretrained/<name>.pth`` when ``path`` is a bare release name, else ``None``."""
    return os.path.join(PRETRAINED_DIR, f'{path}.pth') if path in releases() else None


def resolve_checkpoint(path: str) -> str:
    """A bare release name becomes ``pretrained/<name>.pth``; anything else is returned unchanged."""
    resolved = release_file(path)
    if resolved is None:
        return path
    if not os.path.isfile(resolved):
        raise InputError(f"checkpoint '{path}' is the released model {resolved}, which is not there yet: "
                         f'run python scripts/fetch_weights.py {path}')
    return resolved


def fetch_hint(path: str) -> str:
    """For a missing checkpoint named like a release: how to get it."""
    name = release_name(path)
    return f' (the released {name}: python scripts/fetch_weights.py {name})' if name else ''
