"""Test shim (on PYTHONPATH of an engine subprocess only): vLLM reports the version in
FAKE_VLLM_VERSION, in every process the engine starts, as an out-of-range vLLM would."""

import importlib.abc
import importlib.machinery
import os
import sys

FAKE = os.environ["FAKE_VLLM_VERSION"]


class _FakeVersion(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "vllm.version":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        exec_module = spec.loader.exec_module

        def exec_then_fake(module):
            exec_module(module)
            module.__version__ = FAKE

        spec.loader.exec_module = exec_then_fake
        return spec


sys.meta_path.insert(0, _FakeVersion())
