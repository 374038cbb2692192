"""The pydantic models of both files: what the messages rest on."""

from __future__ import annotations

import pytest
from ml_runtime.contract.spec_file import SpecFile, parse_spec
from ml_runtime.errors import ConfigError
from ml_runtime.policy.config import CONFIG_KEYS, SPEC_KEYS
from ml_runtime.policy.config_file import ConfigFile


def test_the_key_lists_without_pydantic_match_the_models():
    assert CONFIG_KEYS == tuple(ConfigFile.model_fields)
    assert set(SPEC_KEYS) < set(SpecFile.model_fields)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # A misspelt vendor gets the same did-you-mean hint as a misspelt key.
        ({"required_features": [{"driver_version_min": {"nvdia": "535"}}]},
         ("s.yaml: required_features[0].driver_version_min.nvdia: unknown vendor (did you mean 'nvidia'? "
         "allowed: nvidia, amd, intel)")),
        # The plain-mapping form keeps its own key paths.
        ({"required_features": {"device_memory_gb": "40"}},
         "s.yaml: required_features.device_memory_gb: must be a positive number of GB (10**9 bytes), not '40'"),
        # A misspelt key is named rather than the key it leaves missing.
        ({"dependencies": [{"nmae": "torch"}]},
         ("s.yaml: dependencies[0].nmae: unknown key (did you mean 'name'? allowed: name, version_range, "
         "full_distribution, vendor_agnostic_wheel, host_driver)")),
        ({"dependencies": [{"name": "torch", "full_distribution": None}]},
         "s.yaml: dependencies[0].full_distribution: must be true or false, not null"),
    ],
)
def test_messages(data, message):
    with pytest.raises(ConfigError) as info:
        parse_spec(data, "s.yaml")
    assert str(info.value) == message
