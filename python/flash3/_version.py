# The package version; the library reports its own through flash3_version(),
# and `python -m flash3.info` shows both so a mismatch is visible.
__version__ = "0.1.0"
