"""The training sampler: BasicSR's ``EnlargedSampler`` made resumable mid-epoch."""
import torch
from torch.utils.data import Dataset

from basicsr.data.data_sampler import EnlargedSampler


class ResumableSampler(EnlargedSampler):
    """BasicSR's ``EnlargedSampler`` that can start mid-epoch and hands out draw numbers.

    For datasets with ``accepts_draw_numbers`` it yields ``epoch * total_size + slot`` instead of
    ``slot % len(dataset)``; the dataset reads image ``draw % len`` and seeds that sample's
    augmentation with the draw, so crops depend on the schedule, not on worker RNG state.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, ratio: int = 1, seed: int = 0) -> None:
        super().__init__(dataset, num_replicas, rank, ratio)
        self.seed = seed
        self.skip = 0
        self.draw_numbers = bool(getattr(dataset, 'accepts_draw_numbers', False))

    def __iter__(self):
        generator = torch.Generator()
        generator.manual_seed(self.seed * 1_000_003 + self.epoch)
        slots = torch.randperm(self.total_size, generator=generator).tolist()
        slots = slots[self.rank:self.total_size:self.num_replicas][self.skip:]
        if self.draw_numbers:
            return iter([self.epoch * self.total_size + s for s in slots])
        size = len(self.dataset)
        return iter([s % size for s in slots])


class CameraBalancedSampler(ResumableSampler):
    """Batches that each hold every source camera (CorGrad needs one gradient per camera per step).

    A batch of ``batch_size`` gets ``batch_size // C`` images of each of the C cameras, and the
    remaining ``batch_size % C`` slots go to cameras drawn without replacement. Each camera's
    images are drawn from its own reshuffled cycle, so small cameras repeat and large ones are
    subsampled: the epoch length stays BasicSR's (``len(dataset) * ratio / replicas``, cut to
    whole batches). Everything is a pure function of (seed, epoch, rank), and ``skip`` drops
    whole batches, so a resumed run reads the same batches; with draw numbers each draw seeds its
    own crop.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, ratio: int = 1, seed: int = 0,
                 batch_size: int = 1) -> None:
        super().__init__(dataset, num_replicas, rank, ratio, seed)
        self.cameras = dataset_cameras(dataset)
        self.by_camera = {c: [i for i, cam in enumerate(self.cameras) if cam == c] for c in sorted(set(self.cameras))}
        if len(self.by_camera) < 2:
            raise ValueError(f'camera-balanced batches need at least two cameras, the dataset has '
                             f'{sorted(self.by_camera)}')
        if batch_size < len(self.by_camera):
            raise ValueError(f'batch_size_per_gpu {batch_size} is smaller than the number of source cameras '
                             f'({len(self.by_camera)}): a batch cannot hold every camera')
        self.batch_size = batch_size
        self.batches = self.num_samples // batch_size

    def __len__(self) -> int:
        return self.batches * self.batch_size

    def __iter__(self):
        generator = torch.Generator()
        generator.manual_seed((self.seed * 1_000_003 + self.epoch) * 4099 + self.rank)
        names = list(self.by_camera)
        cycles = {c: [] for c in names}
        share, extra = divmod(self.batch_size, len(names))
        chosen = []
        for _ in range(self.batches):
            lucky = [names[k] for k in torch.randperm(len(names), generator=generator)[:extra].tolist()]
            for camera in names:
                for _ in range(share + (camera in lucky)):
                    if not cycles[camera]:
                        members = self.by_camera[camera]
                        cycles[camera] = [members[k] for k in torch.randperm(len(members), generator=generator).tolist()]
                    chosen.append(cycles[camera].pop())
        start = (self.epoch * self.num_replicas + self.rank) * len(self)
        size = len(self.dataset)
        if self.draw_numbers:   # distinct per draw, image = draw % len(dataset)
            chosen = [index + size * (start + slot) for slot, index in enumerate(chosen)]
        return iter(chosen[self.skip:])


def dataset_cameras(dataset: Dataset) -> list:
    """The camera of every item, in index order (datasets expose ``item_cameras``)."""
    cameras = getattr(dataset, 'item_cameras', None)
    if cameras is None:
        raise ValueError(f'{type(dataset).__name__} does not say which camera each image comes from '
                         '(camera-balanced batches need DRealSRCameraDataset)')
    return list(cameras() if callable(cameras) else cameras)


def training_sampler(dataset: Dataset, opt: dict, balance_cameras: bool) -> ResumableSampler:
    """The training loader's sampler: camera-balanced batches when the model asks for them."""
    train_opt = opt['datasets']['train']
    ratio = train_opt.get('dataset_enlarge_ratio', 1)
    if balance_cameras:
        return CameraBalancedSampler(dataset, opt['world_size'], opt['rank'], ratio, seed=opt['manual_seed'],
                                     batch_size=int(train_opt['batch_size_per_gpu']))
    return ResumableSampler(dataset, opt['world_size'], opt['rank'], ratio, seed=opt['manual_seed'])
