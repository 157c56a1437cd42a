"""The presets ``hf:NAME`` names: one directory each, ``config.json`` in transformers' own format (read
as ``hf:PATH`` reads a directory) and ``layerscope.json`` beside it (description, the parameter count the
config builds, the published figure and its source, default inputs). See ``layerscope.hf_sources``."""
