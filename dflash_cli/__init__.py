"""The `dflash` command line and the server launcher behind it: a layer above the core
(`dflash_plugin`) and the engine adapters (`vllm_ext`, `sglang_ext`), which import nothing
from here."""
