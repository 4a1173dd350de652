"""`python -m vcppo.bench <benchmark> [args]`: the same as `vcppo bench`."""
import sys

from vcppo.bench import main

sys.exit(main())
