"""Camera-balanced batches for CorGrad: every batch holds every camera, resume by skip is exact."""
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

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


class Plain:
    """A dataset that says neither its items' cameras nor that it takes draw numbers (BasicSR's own)."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size


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


# ---------------------------------------------------------------- seeds are independent (issue 58)

#: 48 images of four cameras: long enough that two unrelated orders share few positions.
MANY = Cameras([c for c in 'ABCD' for _ in range(12)])


def image_orders(kind, seed, epochs):
    """The images (indices into the dataset) the training loader reads in each epoch, for a study
    seed (``manual_seed``): the plain training sampler or CorGrad's camera-balanced one; draw numbers
    are mapped to their image (draw % len), as the dataset reads them."""
    from basicsr_ldt.data.sampler import ResumableSampler
    data = Cameras(MANY.cameras)
    data.accepts_draw_numbers = True
    sampler = (ResumableSampler(data, 1, 0, ratio=1, seed=seed) if kind == 'plain'
               else CameraBalancedSampler(data, 1, 0, ratio=1, seed=seed, batch_size=4))
    orders = []
    for epoch in epochs:
        sampler.set_epoch(epoch)
        orders.append([d % len(data) for d in sampler])
    return orders


def assert_unrelated(first, second, where):
    """Two image orders of one epoch length: not equal, and agreeing at no more than half the positions.
    Independent shuffles of 48 agree at about 1 position (plain) or 4 (balanced: each position holds a
    fixed camera's turn, 1 in 12); at 24 or more the chance is below 1e-12, while a shared order agrees
    at all 48."""
    assert first != second, where
    same = sum(a == b for a, b in zip(first, second))
    assert same < len(first) // 2, (where, same)


@pytest.mark.parametrize('kind', ['plain', 'balanced'])
def test_neighbouring_seeds_do_not_share_data_orders_across_epochs(kind):
    """A study's seeds are meant to be independent runs: its intervals over seeds measure the noise of
    data order and initialisation. So no epoch of seed s may read the images in the order of any
    epoch of seed s + 1 -- in particular not seed s at epoch e in seed s + 1's order of epoch e - 1.
    Kills the slip that mixes seed and epoch into one number (seed + epoch), which makes every epoch of
    seed s + 1 replay the next one of seed s."""
    epochs = range(6)
    for seed in (0, 1, 2, 41):
        ours, next_seed = image_orders(kind, seed, epochs), image_orders(kind, seed + 1, epochs)
        for e, order in enumerate(ours):
            for f, other in enumerate(next_seed):
                assert_unrelated(order, other, (kind, seed, e, f))


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(['plain', 'balanced']), seed=st.integers(0, 10 ** 6),
       offset=st.integers(1, 10 ** 6), epochs=st.integers(2, 6))
def test_any_two_seeds_draw_unrelated_orders_over_several_epochs(kind, seed, offset, epochs):
    """Property over pairs of seeds and run lengths: every epoch of one seed reads the images in an
    order unrelated to every epoch of the other (and the epochs of one seed differ from each other),
    so no seed replays another's data order shifted in time. Kills any slip that lets seed and epoch
    trade places in the sampler's generator seed (seed + epoch, epoch * k + seed with small k, ...)."""
    ours, theirs = image_orders(kind, seed, range(epochs)), image_orders(kind, seed + offset, range(epochs))
    for e, order in enumerate(ours):
        for f, other in enumerate(theirs):
            assert_unrelated(order, other, (e, f))
        for f in range(e):
            assert order != ours[f], (e, f)


# ---------------------------------------------------------------- the sampler the training loop builds (issue 58)

def test_training_sampler_follows_the_options_and_the_models_request():
    """What Train_pip.py's loader draws from: the plain resumable sampler with the run's world size,
    rank, ``dataset_enlarge_ratio`` and ``manual_seed``, or, when the model asks for camera-balanced
    batches (CorGrad), the balanced one with the per-GPU batch size. Kills mutants of
    ``training_sampler`` that drop or swap one of these (mutation testing)."""
    from basicsr_ldt.data.sampler import ResumableSampler, training_sampler
    opt = {'world_size': 2, 'rank': 1, 'manual_seed': 17,
           'datasets': {'train': {'dataset_enlarge_ratio': 3, 'batch_size_per_gpu': 4}}}
    plain = training_sampler(DATA, opt, balance_cameras=False)
    assert type(plain) is ResumableSampler
    assert (plain.num_replicas, plain.rank, plain.seed, plain.total_size) == (2, 1, 17, 36)
    assert list(plain) == list(ResumableSampler(DATA, 2, 1, 3, seed=17))
    balanced = training_sampler(DATA, opt, balance_cameras=True)
    assert type(balanced) is CameraBalancedSampler
    assert (balanced.num_replicas, balanced.rank, balanced.seed, balanced.batch_size) == (2, 1, 17, 4)
    assert list(balanced) == list(CameraBalancedSampler(DATA, 2, 1, 3, seed=17, batch_size=4))
    del opt['datasets']['train']['dataset_enlarge_ratio']            # BasicSR's default ratio is 1
    assert training_sampler(DATA, opt, balance_cameras=False).total_size == 12


def test_without_draw_numbers_the_plain_sampler_yields_every_image_ratio_times_and_skips_on_resume():
    """A dataset that takes plain indices gets each image ``ratio`` times per epoch (slot % len), in
    an order fixed by seed and epoch; ``skip`` (resume mid-epoch) drops exactly the first draws."""
    from basicsr_ldt.data.sampler import ResumableSampler
    sampler = ResumableSampler(DATA, 1, 0, ratio=2, seed=5)
    sampler.set_epoch(2)
    order = list(sampler)
    assert Counter(order) == Counter(list(range(12)) * 2)
    again = ResumableSampler(DATA, 1, 0, ratio=2, seed=5)
    again.set_epoch(2)
    again.skip = 5
    assert list(again) == order[5:]


def test_a_dataset_that_does_not_name_its_cameras_is_refused_by_name():
    """CorGrad's balanced batches need each item's camera: a dataset without ``item_cameras`` is
    refused naming its class; a plain list attribute works like the method."""
    from basicsr_ldt.data.sampler import dataset_cameras
    with pytest.raises(ValueError, match=r'^Plain does not say which camera each image comes from .*DRealSRCameraDataset\)$'):
        CameraBalancedSampler(Plain(3), 1, 0, batch_size=2)
    listed = Plain(3)
    listed.item_cameras = ('X', 'Y', 'X')
    assert dataset_cameras(listed) == ['X', 'Y', 'X']
    assert dataset_cameras(DATA) == DATA.cameras


def test_two_cameras_are_enough_and_each_rank_and_epoch_draws_its_own_block():
    """CorGrad with two source cameras is the smallest valid case; under torchrun each (epoch, rank)
    draws from its own block of draw numbers, none negative (a draw seeds the crop's generator, which
    refuses negative seeds). Kills the balanced sampler's ``< 2`` spelt ``<= 2`` and the block start
    ``(epoch * replicas - rank)``."""
    data = Cameras(['A'] * 5 + ['B'] * 3)
    data.accepts_draw_numbers = True
    assert len(CameraBalancedSampler(data, 1, 0, ratio=1, seed=0, batch_size=2)) == 8
    for epoch in range(3):
        for rank in range(2):
            sampler = CameraBalancedSampler(data, 2, rank, ratio=2, seed=4, batch_size=2)
            sampler.set_epoch(epoch)
            block = (epoch * 2 + rank) * len(sampler)
            draws = list(sampler)
            assert [d // len(data) for d in draws] == list(range(block, block + len(sampler))), (epoch, rank)


def test_the_plain_sampler_defaults_and_a_dataset_without_draw_numbers():
    """BasicSR's defaults (ratio 1, seed 0) and plain indices for a dataset that does not declare
    ``accepts_draw_numbers`` (BasicSR's own datasets); the balanced sampler's defaults too, whose
    batch of one is refused for two cameras."""
    from basicsr_ldt.data.sampler import ResumableSampler
    sampler = ResumableSampler(Plain(5), 1, 0)
    assert (sampler.total_size, sampler.seed, sampler.draw_numbers) == (5, 0, False)
    assert sorted(sampler) == [0, 1, 2, 3, 4]
    assert list(sampler) == list(ResumableSampler(Plain(5), 1, 0, ratio=1, seed=0))
    assert list(CameraBalancedSampler(DATA, 1, 0, batch_size=3)) == list(
        CameraBalancedSampler(DATA, 1, 0, ratio=1, seed=0, batch_size=3))
    with pytest.raises(ValueError, match='batch_size_per_gpu 1 is smaller than the number of source cameras'):
        CameraBalancedSampler(Cameras(['A', 'B']), 1, 0)
