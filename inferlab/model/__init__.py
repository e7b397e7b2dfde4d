"""The model: devices and dtypes, the registry of loadable models, multi-GPU layouts."""
