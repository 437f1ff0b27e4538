import sys

from flash_dllm_jax.cli import main

sys.exit(main())
