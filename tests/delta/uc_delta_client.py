"""unitycatalog-client 0.7.0's `unitycatalog.delta` (the Delta API v1.0 client), with the gaps of its wheel filled,
and nothing else: the tests drive the v1 API through its own `DeltaConfigurationApi`, `DeltaTablesApi` and
`DeltaTemporaryCredentialsApi` classes and request models.

The gaps, as shipped:
- `unitycatalog.delta.api_client`, `api_response` and `rest` are missing, though every API class imports them.
  They are the same generated code as `unitycatalog.client`'s, so those modules are registered under the missing
  names, with one change to `ApiClient`: it resolves response types by name in `unitycatalog.client.models`, where
  no Delta v1 model is.
- The models' `from_dict` is lossy (`DeltaStructType.from_dict` drops `fields`, struct-field metadata is dropped,
  each update or requirement subtype keeps only its `type`/`action`), so a response read through it would not
  show what the server answered. The responses are returned as their JSON (dicts) instead.
- The client's own patch that writes a column type as Delta does (`"long"`, not `{"type": "long"}`),
  `unitycatalog.delta.internal.serde.delta_data_type_module`, is not imported by its models package: imported
  here. (It still drops a struct field's metadata: tests that send some use raw HTTP.)
"""

from __future__ import annotations

import json
import sys
import types

import unitycatalog.client.api_client as _api_client
import unitycatalog.client.api_response as _api_response
import unitycatalog.client.rest as _rest
from unitycatalog.client import Configuration
from unitycatalog.client.exceptions import ApiException


class DeltaApiClient(_api_client.ApiClient):
    def deserialize(self, response_text: str, response_type: str, content_type):
        return json.loads(response_text) if response_text else None


_module = types.ModuleType("unitycatalog.delta.api_client")
_module.ApiClient = DeltaApiClient
_module.RequestSerialized = _api_client.RequestSerialized
sys.modules.setdefault("unitycatalog.delta.api_client", _module)
sys.modules.setdefault("unitycatalog.delta.api_response", _api_response)
sys.modules.setdefault("unitycatalog.delta.rest", _rest)

# The client's own fix for its types' wire form (string-or-object), which its models' __init__ does not import.
import unitycatalog.delta.internal.serde.delta_data_type_module  # noqa: E402,F401
from unitycatalog.delta.api.delta_configuration_api import DeltaConfigurationApi  # noqa: E402
from unitycatalog.delta.api.delta_tables_api import DeltaTablesApi  # noqa: E402
from unitycatalog.delta.api.delta_temporary_credentials_api import DeltaTemporaryCredentialsApi  # noqa: E402

__all__ = ["ApiException", "DeltaConfigurationApi", "DeltaTablesApi", "DeltaTemporaryCredentialsApi",
           "delta_client", "error_of"]


def delta_client(base_url: str, token: str | None = None) -> DeltaApiClient:
    """An ApiClient for the service's Unity Catalog root (the v1 client's paths start at `/delta/v1`)."""
    config = Configuration(host=base_url + "/api/2.1/unity-catalog", access_token=token)
    return DeltaApiClient(config)


def error_of(exc: ApiException) -> dict:
    """The v1 error model's `error` object of a refused request."""
    return json.loads(exc.body)["error"]
