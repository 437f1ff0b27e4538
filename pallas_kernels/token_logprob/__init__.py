"""log softmax(logits)[token] per row: XLA reference and a fixed-order kernel."""
