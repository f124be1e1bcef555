"""The TensorRT-LLM releases the driver serves: 1.2.1 and 1.3 from 1.3.0rc29, nothing else."""

from __future__ import annotations

import pytest
from openengine_backends.trtllm.versions import check_version
from openengine_gateway.spi import ConfigurationError


@pytest.mark.parametrize("version", ["1.2.1", "1.2.1.post1", "1.3.0rc29", "1.3.0rc29.post1", "1.3.0", "1.3.2"])
def test_the_two_lines_read_are_served(version: str) -> None:
    check_version(version)


@pytest.mark.parametrize("version", ["1.2.0", "1.2.1rc3", "1.3.0rc5.post2", "1.3.0rc28", "1.4.0rc0", "0.21.0", "dev"])
def test_any_other_release_is_refused_naming_it(version: str) -> None:
    with pytest.raises(ConfigurationError, match=version.replace(".", r"\.")):
        check_version(version)
