"""SGLang adapter of dflash-plugin: `--speculative-algorithm DFLASH` runs this project's drafter
(see README.md here). Importing this package imports nothing from SGLang."""
