"""Incremental alter configs (Kafka API 44, KIP-339), which aiokafka 0.14 does not offer.

aiokafka's `alter_configs` is the older AlterConfigs (API 33): it *replaces* a topic's whole set of dynamic
settings, so setting `min.insync.replicas` alone would reset every other setting an operator gave the topic.
IncrementalAlterConfigs sets only the named keys and leaves the rest alone, which is what `topics --fix`
needs. Version 0 (Kafka 2.3+, still served by Kafka 4) is enough: it is the non-flexible encoding aiokafka's
protocol types write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResourceType
from aiokafka.errors import for_code
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Int8, Int16, Int32, Schema, String

OP_SET = 0


class IncrementalAlterConfigsResponse_v0(Response):
    API_KEY = 44
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "responses",
            Array(
                ("error_code", Int16),
                ("error_message", String("utf-8")),
                ("resource_type", Int8),
                ("resource_name", String("utf-8")),
            ),
        ),
    )


class IncrementalAlterConfigsRequest_v0(RequestStruct):
    API_KEY = 44
    API_VERSION = 0
    RESPONSE_TYPE = IncrementalAlterConfigsResponse_v0
    SCHEMA = Schema(
        (
            "resources",
            Array(
                ("resource_type", Int8),
                ("resource_name", String("utf-8")),
                (
                    "configs",
                    Array(
                        ("name", String("utf-8")),
                        ("config_operation", Int8),
                        ("value", String("utf-8")),
                    ),
                ),
            ),
        ),
        ("validate_only", Boolean),
    )


class IncrementalAlterConfigsRequest(Request[IncrementalAlterConfigsRequest_v0]):
    API_KEY = 44

    def __init__(self, resources: list[Any], validate_only: bool = False) -> None:
        self._resources = resources
        self._validate_only = validate_only

    def build(self, request_struct_class: type[IncrementalAlterConfigsRequest_v0]) -> IncrementalAlterConfigsRequest_v0:
        return request_struct_class(self._resources, self._validate_only)


async def set_topic_configs(admin: AIOKafkaAdminClient, changes: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """Set `topic -> {setting: value}` in place, nothing else; returns topic -> error for the topics refused.

    Any broker takes a topic's configuration change (it forwards it to the controller).
    """
    if not changes:
        return {}
    resources = [
        (int(ConfigResourceType.TOPIC), topic, [(name, OP_SET, value) for name, value in settings.items()])
        for topic, settings in changes.items()
    ]
    # aiokafka's admin has no public call for a request it does not know; its own calls send this same way
    response = await admin._send_request(IncrementalAlterConfigsRequest(resources))
    refused: dict[str, str] = {}
    for error_code, error_message, _type, name in response.responses:
        if error_code != 0:
            refused[name] = f"{for_code(error_code).__name__}: {error_message or ''}".rstrip(": ")
    return refused
