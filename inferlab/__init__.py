"""inferlab: see how a causal LM generates text, and measure that generation honestly."""

__version__ = "0.1.0"
