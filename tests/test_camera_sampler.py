"""Camera-balanced batches for CorGrad: every batch holds every camera, resume by skip is exact."""
from collections import Counter

import pytest

from basicsr_ldt.data.sampler import CameraBalancedSampler


class Cameras:
    """A dataset that only knows its items' cameras (all the sampler reads)."""

    accepts_draw_numbers = False

    def __init__(self, cameras):
        self.cameras = list(cameras)

    def item_cameras(self):
        return self.cameras

    def __len__(self):
        return len(self.cameras)


DATA = Cameras(['A'] * 7 + ['B'] * 3 + ['C'] * 2)


def batches(sampler, size):
    indices = list(sampler)
    return [indices[k:k + size] for k in range(0, len(indices), size)]


@pytest.mark.parametrize('batch_size', [3, 4, 5])
def test_every_batch_holds_every_camera_evenly(batch_size):
    sampler = CameraBalancedSampler(DATA, 1, 0, ratio=2, seed=1, batch_size=batch_size)
    assert len(sampler) == (24 // batch_size) * batch_size
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for batch in batches(sampler, batch_size):
            counts = Counter(DATA.cameras[i] for i in batch)
            assert set(counts) == {'A', 'B', 'C'}
            assert max(counts.values()) - min(counts.values()) <= 1


def test_small_cameras_cycle_through_all_their_images():
    sampler = CameraBalancedSampler(DATA, 1, 0, ratio=2, seed=0, batch_size=3)
    seen = Counter(list(sampler))
    assert {i for i in seen if DATA.cameras[i] == 'C'} == {10, 11} and seen[10] == seen[11] == 4


def test_skip_resumes_the_same_batches_and_epochs_differ():
    sampler = CameraBalancedSampler(DATA, 1, 0, ratio=2, seed=0, batch_size=4)
    sampler.set_epoch(3)
    whole = list(sampler)
    sampler.skip = 2 * 4
    assert list(sampler) == whole[8:]
    sampler.skip = 0
    sampler.set_epoch(4)
    assert list(sampler) != whole


def test_draw_numbers_are_unique_and_map_to_the_chosen_image():
    data = Cameras(DATA.cameras)
    data.accepts_draw_numbers = True
    sampler = CameraBalancedSampler(data, 2, 1, ratio=2, seed=0, batch_size=3)
    plain = CameraBalancedSampler(DATA, 2, 1, ratio=2, seed=0, batch_size=3)
    draws = {}
    for epoch in range(2):
        sampler.set_epoch(epoch)
        plain.set_epoch(epoch)
        ours = list(sampler)
        assert [d % len(data) for d in ours] == list(plain)
        draws.update((d, epoch) for d in ours)
    assert len(draws) == 2 * len(sampler)


def test_one_camera_or_a_too_small_batch_is_refused():
    with pytest.raises(ValueError, match='at least two cameras'):
        CameraBalancedSampler(Cameras(['A'] * 4), 1, 0, batch_size=2)
    with pytest.raises(ValueError, match='smaller than the number of source cameras'):
        CameraBalancedSampler(DATA, 1, 0, batch_size=2)


def test_ranks_under_torchrun_never_draw_the_same_sample():
    """With two processes each rank gets its own draws (same draw = same image and same crop): the plain
    sampler splits the epoch's slots between the ranks, the balanced one keeps draw numbers apart."""
    from basicsr_ldt.data.sampler import ResumableSampler
    data = Cameras(DATA.cameras)
    data.accepts_draw_numbers = True
    for epoch in range(2):
        plain = [ResumableSampler(data, 2, rank, ratio=2, seed=0) for rank in (0, 1)]
        balanced = [CameraBalancedSampler(data, 2, rank, ratio=2, seed=0, batch_size=3) for rank in (0, 1)]
        for sampler in plain + balanced:
            sampler.set_epoch(epoch)
        first, second = list(plain[0]), list(plain[1])
        assert len(first) == len(second) == 12 and not set(first) & set(second)
        assert sorted(first + second) == list(range(epoch * 24, epoch * 24 + 24))
        first, second = list(balanced[0]), list(balanced[1])
        assert len(first) == len(second) == 12 and not set(first) & set(second)
