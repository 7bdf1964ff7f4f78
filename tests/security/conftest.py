"""The security tests use the runtime's real stacks and the bundle tests' supervisor parser."""

from tests.bundle.conftest import programs  # noqa: F401 - a fixture
from tests.runtime.conftest import stack  # noqa: F401 - a fixture
