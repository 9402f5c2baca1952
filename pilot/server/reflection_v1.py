"""`grpc.reflection.v1`: server reflection's v1 messages, made from v1alpha's.

grpcio-reflection ships only `grpc.reflection.v1alpha`, while newer clients
(grpcurl 1.8.8 and later, evans, Postman) ask for `grpc.reflection.v1` first.
v1 is v1alpha's file under a new package name: the same messages, field names
and field numbers, so the bytes on the wire are the same and v1alpha's servicer
answers v1 callers unchanged. What v1 needs of its own is a descriptor, so
that reflection can describe v1 itself and v1 requests are decoded (and
refused) as v1 messages. This module makes that descriptor from v1alpha's,
renaming only the package (and the file, and the language options that name
it), adds it to the default descriptor pool, and exposes its message classes.
Making it from v1alpha's, rather than keeping a second copy of the schema,
means the two can never disagree on a field.
"""

from __future__ import annotations

from google.protobuf import descriptor, descriptor_pb2, descriptor_pool, message, message_factory
from grpc_reflection.v1alpha import reflection_pb2

V1ALPHA_PACKAGE = "grpc.reflection.v1alpha"
PACKAGE = "grpc.reflection.v1"
FILE_NAME = "grpc/reflection/v1/reflection.proto"
SERVICE_NAME = f"{PACKAGE}.ServerReflection"


def _renamed(type_name: str) -> str:
    """A fully-qualified type reference, moved from v1alpha's package to v1's."""
    old = f".{V1ALPHA_PACKAGE}."
    return f".{PACKAGE}.{type_name.removeprefix(old)}" if type_name.startswith(old) else type_name


def _rename_messages(messages: list[descriptor_pb2.DescriptorProto]) -> None:
    for message_type in messages:
        for field in message_type.field:
            if field.type_name:
                field.type_name = _renamed(field.type_name)
        _rename_messages(list(message_type.nested_type))


def v1_file() -> descriptor_pb2.FileDescriptorProto:
    """v1alpha's FileDescriptorProto with v1's package, file name and options."""
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = FILE_NAME
    proto.package = PACKAGE
    _rename_messages(list(proto.message_type))
    for service in proto.service:
        for method in service.method:
            method.input_type = _renamed(method.input_type)
            method.output_type = _renamed(method.output_type)
    proto.options.ClearField("deprecated")  # v1alpha is deprecated in favour of v1
    proto.options.java_package = "io.grpc.reflection.v1"
    proto.options.go_package = "google.golang.org/grpc/reflection/grpc_reflection_v1"
    return proto


def _registered() -> descriptor.FileDescriptor:
    """The v1 file in the default pool: whoever added it first (a later grpcio may ship it)."""
    pool = descriptor_pool.Default()
    try:
        return pool.FindFileContainingSymbol(SERVICE_NAME)
    except KeyError:
        return pool.AddSerializedFile(v1_file().SerializeToString())


DESCRIPTOR = _registered()


def _message_class(name: str) -> type[message.Message]:
    return message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name[name])


ServerReflectionRequest = _message_class("ServerReflectionRequest")
ServerReflectionResponse = _message_class("ServerReflectionResponse")
