"""On PYTHONPATH with DFLASH_PHASE_DIR set, every Python process (a server's front end, engine
core and worker) times the engine step's phases (tools/phase_times.py) into that folder."""

import os
import sys

if os.environ.get("DFLASH_PHASE_DIR"):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import phase_times

    phase_times.install_on_import(os.environ["DFLASH_PHASE_DIR"])
