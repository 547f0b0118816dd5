import sys

from vllm_fleet.cli import main

sys.exit(main())
