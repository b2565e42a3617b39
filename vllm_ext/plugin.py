"""vLLM general-plugin entry point (work in progress: registers nothing yet)."""


def register():
    return None
