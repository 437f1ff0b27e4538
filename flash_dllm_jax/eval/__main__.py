import sys

from flash_dllm_jax.eval.cli import main

sys.exit(main())
