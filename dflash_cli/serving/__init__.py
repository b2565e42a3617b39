"""Serving helpers behind `dflash serve` and `dflash bench`: flag translation and YAML configs
(flags.py), the server process (server.py), vLLM's CLI entry point for the CPU build
(vllm_main.py), and the benchmark client, runner and plots (bench.py)."""
