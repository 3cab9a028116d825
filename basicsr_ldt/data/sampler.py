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
