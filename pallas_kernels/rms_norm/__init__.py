"""RMSNorm per row: XLA reference and a fixed-order kernel."""
