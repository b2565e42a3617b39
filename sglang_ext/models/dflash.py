"""Registry entry: the DFlash draft architecture of published checkpoints."""

from sglang_ext.draft_model import DFlashDraftModel

EntryClass = [DFlashDraftModel]
