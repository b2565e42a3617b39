"""Model classes SGLang's model registry imports from this package (modules with `EntryClass`).
Registered by sglang_ext.registration with `ModelRegistry.register(..., overwrite=True)`."""
