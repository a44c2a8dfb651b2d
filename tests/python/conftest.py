"""Lets the tests run from a source checkout: python/ goes on sys.path when
flash3 is not installed. The library is found as in flash3._lib.find_library
($FLASH3_LIBRARY, the package directory, then <repo>/build/)."""

import importlib.util
import pathlib
import sys

if importlib.util.find_spec("flash3") is None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
