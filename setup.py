"""The one compiled module, the arena cache (dflash_plugin/_arena_cache.c); the rest of the
build is declared in pyproject.toml. It is optional: without a C compiler the package installs
without it and servers run as before (dflash_plugin.arena_cache says so at start-up)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("dflash_plugin._arena_cache", ["dflash_plugin/_arena_cache.c"],
                             optional=True)])
