"""A small CRI client for the runtime proof: the few runtime.v1 calls kubelet makes on a sandbox.

Only the messages and fields these calls need are declared, each with its field number from
k8s.io/cri-api's api.proto (package runtime.v1), so the bytes on the wire are the ones kubelet
sends; fields left out are simply never set, as proto3 allows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# gRPC's fork handlers run in a child forked while a channel is open, and can abort it before
# it execs (SIGABRT, "epoll_wait error: Bad file descriptor"): seen on Python 3.9, whose
# subprocess forks where newer ones use vfork. The tests start processes while a client is open.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc
from google.protobuf import descriptor_pb2, message_factory

_PACKAGE = "runtime.v1"
_SERVICE = "/runtime.v1.RuntimeService/"

_F = descriptor_pb2.FieldDescriptorProto
_STRING, _BOOL, _INT32, _INT64, _UINT32 = (
    _F.TYPE_STRING,
    _F.TYPE_BOOL,
    _F.TYPE_INT32,
    _F.TYPE_INT64,
    _F.TYPE_UINT32,
)
_MESSAGE, _ENUM = _F.TYPE_MESSAGE, _F.TYPE_ENUM

# name -> [(field name, number, type, type name for messages and enums, repeated)]
_MESSAGES: dict[str, list[tuple[str, int, int, str, bool]]] = {
    "VersionRequest": [("version", 1, _STRING, "", False)],
    "VersionResponse": [
        ("version", 1, _STRING, "", False),
        ("runtime_name", 2, _STRING, "", False),
        ("runtime_version", 3, _STRING, "", False),
        ("runtime_api_version", 4, _STRING, "", False),
    ],
    "PortMapping": [
        ("protocol", 1, _ENUM, "Protocol", False),
        ("container_port", 2, _INT32, "", False),
        ("host_port", 3, _INT32, "", False),
        ("host_ip", 4, _STRING, "", False),
    ],
    "PodSandboxMetadata": [
        ("name", 1, _STRING, "", False),
        ("uid", 2, _STRING, "", False),
        ("namespace", 3, _STRING, "", False),
        ("attempt", 4, _UINT32, "", False),
    ],
    "LinuxPodSandboxConfig": [("cgroup_parent", 1, _STRING, "", False)],
    "PodSandboxConfig": [
        ("metadata", 1, _MESSAGE, "PodSandboxMetadata", False),
        ("hostname", 2, _STRING, "", False),
        ("log_directory", 3, _STRING, "", False),
        ("port_mappings", 5, _MESSAGE, "PortMapping", True),
        ("linux", 8, _MESSAGE, "LinuxPodSandboxConfig", False),
    ],
    "RunPodSandboxRequest": [
        ("config", 1, _MESSAGE, "PodSandboxConfig", False),
        ("runtime_handler", 2, _STRING, "", False),
    ],
    "RunPodSandboxResponse": [("pod_sandbox_id", 1, _STRING, "", False)],
    "StopPodSandboxRequest": [("pod_sandbox_id", 1, _STRING, "", False)],
    "StopPodSandboxResponse": [],
    "RemovePodSandboxRequest": [("pod_sandbox_id", 1, _STRING, "", False)],
    "RemovePodSandboxResponse": [],
    "PodSandboxStatusRequest": [
        ("pod_sandbox_id", 1, _STRING, "", False),
        ("verbose", 2, _BOOL, "", False),
    ],
    "PodSandboxNetworkStatus": [("ip", 1, _STRING, "", False)],
    "PodSandboxStatus": [
        ("id", 1, _STRING, "", False),
        ("metadata", 2, _MESSAGE, "PodSandboxMetadata", False),
        ("state", 3, _ENUM, "PodSandboxState", False),
        ("created_at", 4, _INT64, "", False),
        ("network", 5, _MESSAGE, "PodSandboxNetworkStatus", False),
    ],
    "PodSandboxStatusResponse": [("status", 1, _MESSAGE, "PodSandboxStatus", False)],
    "PodSandbox": [
        ("id", 1, _STRING, "", False),
        ("metadata", 2, _MESSAGE, "PodSandboxMetadata", False),
        ("state", 3, _ENUM, "PodSandboxState", False),
    ],
    "ListPodSandboxRequest": [],
    "ListPodSandboxResponse": [("items", 1, _MESSAGE, "PodSandbox", True)],
}
_ENUMS = {
    "Protocol": [("TCP", 0), ("UDP", 1), ("SCTP", 2)],
    "PodSandboxState": [("SANDBOX_READY", 0), ("SANDBOX_NOTREADY", 1)],
}


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="cni_reaper_tests/cri_subset.proto", package=_PACKAGE, syntax="proto3"
    )
    for enum_name, values in _ENUMS.items():
        enum = proto.enum_type.add(name=enum_name)
        for value_name, number in values:
            enum.value.add(name=value_name, number=number)
    for message_name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=message_name)
        for field_name, number, kind, type_name, repeated in fields:
            field = message.field.add(
                name=field_name,
                number=number,
                type=kind,
                label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
            )
            if type_name:
                field.type_name = f".{_PACKAGE}.{type_name}"
    return proto


def _message_classes() -> dict[str, Any]:
    # One argument only: Debian 12's protobuf 3.21 (in the VM guest) takes no pool.
    classes = message_factory.GetMessages([_file_descriptor()])
    return {name: classes[f"{_PACKAGE}.{name}"] for name in _MESSAGES}


MESSAGES = _message_classes()


class CriError(Exception):
    """A CRI call failed; the runtime's own message is kept as it came."""

    def __init__(self, call: str, code: str, details: str) -> None:
        super().__init__(f"{call}: {code}: {details}")
        self.call = call
        self.code = code
        self.details = details


@dataclass(frozen=True)
class Sandbox:
    id: str
    name: str
    ready: bool
    ip: str


class RuntimeClient:
    """runtime.v1.RuntimeService over the runtime's unix socket."""

    def __init__(self, socket_path: str, timeout: float = 60.0) -> None:
        self._channel = grpc.insecure_channel("unix://" + socket_path)
        self._timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request: Any) -> Any:
        response_class = MESSAGES[method.replace("Request", "") + "Response"]
        call = self._channel.unary_unary(
            _SERVICE + method,
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=response_class.FromString,
        )
        try:
            return call(request, timeout=self._timeout)
        except grpc.RpcError as error:
            raise CriError(method, str(error.code()), str(error.details())) from None

    def version(self) -> tuple[str, str]:
        response = self._call("Version", MESSAGES["VersionRequest"](version="v1"))
        return str(response.runtime_name), str(response.runtime_version)

    def run_pod_sandbox(self, name: str, uid: str, cgroup_parent: str, host_port: int) -> str:
        config = MESSAGES["PodSandboxConfig"](
            metadata=MESSAGES["PodSandboxMetadata"](name=name, uid=uid, namespace="default"),
            hostname=name,
            port_mappings=[
                MESSAGES["PortMapping"](protocol=0, container_port=8080, host_port=host_port)
            ],
            linux=MESSAGES["LinuxPodSandboxConfig"](cgroup_parent=cgroup_parent),
        )
        response = self._call("RunPodSandbox", MESSAGES["RunPodSandboxRequest"](config=config))
        return str(response.pod_sandbox_id)

    def stop_pod_sandbox(self, sandbox_id: str) -> None:
        self._call("StopPodSandbox", MESSAGES["StopPodSandboxRequest"](pod_sandbox_id=sandbox_id))

    def remove_pod_sandbox(self, sandbox_id: str) -> None:
        self._call(
            "RemovePodSandbox", MESSAGES["RemovePodSandboxRequest"](pod_sandbox_id=sandbox_id)
        )

    def pod_sandbox_status(self, sandbox_id: str) -> Sandbox:
        response = self._call(
            "PodSandboxStatus", MESSAGES["PodSandboxStatusRequest"](pod_sandbox_id=sandbox_id)
        )
        status = response.status
        return Sandbox(
            id=str(status.id),
            name=str(status.metadata.name),
            ready=status.state == 0,
            ip=str(status.network.ip),
        )

    def list_pod_sandbox(self) -> list[str]:
        response = self._call("ListPodSandbox", MESSAGES["ListPodSandboxRequest"]())
        return [str(item.id) for item in response.items]
