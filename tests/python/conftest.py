"""Lets the tests run from a source checkout: python/ goes on sys.path when
flash3 is not installed. The library is found as in flash3._lib.find_library
($FLASH3_LIBRARY, the package directory, then <repo>/build/)."""

import importlib.util
import os
import pathlib
import random
import sys

import pytest

if importlib.util.find_spec("flash3") is None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))


@pytest.fixture
def seed():
    """A fresh random seed per test (FLASH3_TEST_SEED=<n> replays one); torch
    is seeded with it when torch is installed."""
    value = int(os.environ.get("FLASH3_TEST_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    try:
        import torch
    except ImportError:
        return value
    torch.manual_seed(value)
    return value


@pytest.fixture(scope="module")
def group_of_one(tmp_path_factory):
    """A torch.distributed (gloo) group of this process alone, for the
    world-size-1 paths of flash3.distributed."""
    import torch.distributed as dist

    init = tmp_path_factory.mktemp("dist") / "init"
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()
