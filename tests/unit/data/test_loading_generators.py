"""Main-process loading seeds torch's, ``random``'s and NumPy's generators per batch and puts the
training's states back exactly, NumPy's cached gaussian included, without NumPy's slow state copy
when nothing drew since the last batch."""

import random

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset, default_collate

from trainer.api.module import TrainModule
from trainer.data import loading_generators
from trainer.data.loaders import LoaderOptions, build_loader, draws_no_random_numbers
from trainer.data.loading_generators import LoadingGenerators


def _draws() -> tuple:
    return torch.rand(3).tolist(), [random.random() for _ in range(3)], np.random.standard_normal(3).tolist()


def _states() -> tuple:
    state = np.random.get_state()
    return torch.get_rng_state().tolist(), random.getstate(), (state[0], state[1].tolist(), *state[2:])


def _seed_training(odd_gaussian: bool) -> None:
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    np.random.standard_normal(1 if odd_gaussian else 2)  # one: the legacy generator caches the second


@pytest.mark.parametrize("bytes_path", [True, False])
@pytest.mark.parametrize("odd_gaussian", [False, True])
def test_loading_draws_from_its_seed_and_puts_every_generator_back(bytes_path, odd_gaussian):
    generators = LoadingGenerators()
    if not bytes_path:  # as where numpy's state cannot be read as bytes
        generators._numpy_state().address = None
    _seed_training(odd_gaussian)
    for batch in range(4):
        before = _states()
        saved = generators.enter(1000 + batch)
        drawn = _draws()
        generators.exit(saved)
        assert _states() == before
        torch.manual_seed(1000 + batch), random.seed(1000 + batch), np.random.seed(1000 + batch)
        assert drawn == _draws()  # what a worker seeded with the batch's seed draws
        _seed_training(odd_gaussian)
        for _ in range(batch):  # the training draws between batches (or not, before the second one)
            _draws()


def test_the_numpy_state_is_copied_as_bytes_while_nothing_draws(monkeypatch):
    # np.random.get_state() copies the state word by word (~25 us): after the first batch, a batch
    # whose training drew nothing from NumPy needs no such copy.
    generators = LoadingGenerators()
    assert generators._numpy_state().address is not None  # (built: it checks the layout once)
    _seed_training(odd_gaussian=False)
    expected = _states()
    reads = []
    real = np.random.get_state
    monkeypatch.setattr(np.random, "get_state", lambda *a, **k: reads.append(1) or real(*a, **k))
    for batch in range(5):
        generators.exit(generators.enter(batch))
    assert len(reads) == 1  # the first batch's
    monkeypatch.setattr(np.random, "get_state", real)
    assert _states() == expected
    np.random.standard_normal(1)  # a cached gaussian: the whole state again, kept exactly
    expected = _states()
    generators.exit(generators.enter(9))
    assert _states() == expected


def test_a_replaced_numpy_bit_generator_is_followed():
    generators = LoadingGenerators()
    generators.exit(generators.enter(1))
    previous = np.random.get_bit_generator()
    try:
        np.random.set_bit_generator(np.random.MT19937(5))
        np.random.standard_normal(3)
        expected = _states()
        generators.exit(generators.enter(2))
        assert _states() == expected
    finally:
        np.random.set_bit_generator(previous)


def test_tensor_datasets_with_the_default_collate_are_loaded_without_seeding(monkeypatch):
    data = TensorDataset(torch.arange(8.0))

    class Sub(TensorDataset):
        pass

    class Module(TrainModule):
        pass

    assert draws_no_random_numbers(data, default_collate)
    assert draws_no_random_numbers(data, Module().collate_fn)
    assert not draws_no_random_numbers(Sub(torch.arange(8.0)), default_collate)
    assert not draws_no_random_numbers(data, lambda samples: default_collate(samples))
    entered = []
    monkeypatch.setattr(loading_generators.GENERATORS, "enter", lambda seed: entered.append(seed))
    batches = [b for b in build_loader(data, [[0, 1], [5, 2]], default_collate, LoaderOptions(), seed=3)]
    assert [b[0].tolist() for b in batches] == [[0.0, 1.0], [5.0, 2.0]] and entered == []
