"""Matmul with 8-bit weights (fp8 e4m3 or int8, [O, E] with scales)."""
