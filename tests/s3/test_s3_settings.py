"""S3 settings from the environment, and which keys may be vended."""

from __future__ import annotations

from coordinator.config import Config
from coordinator.credentials import vendable_s3_keys
from coordinator.warehouses import Warehouses
from storage.files import FileIO


def only_default(config: Config) -> Warehouses:
    """The warehouses of a service configured so, before any other is created."""
    return Warehouses(config, None, FileIO(), [])


def test_s3_settings_come_from_the_environment_as_obstore_names_them():
    config = Config.from_env({"COORDINATOR_WAREHOUSE": "s3://b/wh", "COORDINATOR_S3_ENDPOINT": "http://127.0.0.1:9000",
                              "COORDINATOR_S3_REGION": "eu-west-1", "COORDINATOR_S3_PATH_STYLE": "true"})
    assert config.s3_options == {"endpoint": "http://127.0.0.1:9000", "allow_http": "true", "region": "eu-west-1",
                                 "virtual_hosted_style_request": "false"}
    assert Config.from_env({"COORDINATOR_S3_ENDPOINT": "https://s3.example.com"}).s3_options == {
        "endpoint": "https://s3.example.com"}
    assert Config.from_env({}).s3_options == {}


def test_vended_keys_are_the_environments_while_authentication_is_off_and_only_within_the_warehouse():
    config = only_default(Config(warehouse="s3://b/wh", s3_region="eu-west-1"))
    env = {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK"}
    assert vendable_s3_keys(config, False, "s3://b/wh/t", env) == {"region": "eu-west-1", "access_key_id": "AK",
                                                                   "secret_access_key": "SK"}
    assert vendable_s3_keys(config, True, "s3://b/wh/t", env) is None          # authentication on
    assert vendable_s3_keys(config, False, "s3://b/other/t", env) is None      # outside the warehouse
    assert vendable_s3_keys(config, False, "s3://b/wh/t", {"AWS_ACCESS_KEY_ID": "AK"}) is None   # half a key
    given = only_default(Config(warehouse="s3://b/wh",
                                s3_options={"access_key_id": "GIVEN", "secret_access_key": "S"}))
    assert vendable_s3_keys(given, False, "s3://b/wh/t", env)["access_key_id"] == "GIVEN"
