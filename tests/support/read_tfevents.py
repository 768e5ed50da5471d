#!/usr/bin/python3
"""Reads a TensorBoard event file the way TensorBoard does: TFRecord framing with masked
CRC-32C checks, each record a tensorflow.Event parsed by the protobuf runtime (the Event,
Summary and Summary.Value fields TensorBoard's scalars use, declared here from
tensorflow/core/util/event.proto and summary.proto). For the tests of TensorBoardWriter.

usage: read_tfevents.py FILE OUT.json
OUT: {"file_version": str, "scalars": [[step, tag, value], ...]}
"""
import json
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def event_class():
    f = descriptor_pb2.FileDescriptorProto(name="event_subset.proto", package="tensorflow", syntax="proto3")
    F = descriptor_pb2.FieldDescriptorProto
    value = f.message_type.add(name="SummaryValue")
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL)
    summary = f.message_type.add(name="Summary")
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, type_name=".tensorflow.SummaryValue", label=F.LABEL_REPEATED)
    event = f.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, type_name=".tensorflow.Summary", label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.MessageFactory(pool).GetPrototype(pool.FindMessageTypeByName("tensorflow.Event"))


def main():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    Event = event_class()
    data = open(sys.argv[1], "rb").read()
    out = {"file_version": None, "scalars": []}
    pos = 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        assert length_crc == masked(header), "length CRC"
        body = data[pos + 12:pos + 12 + length]
        (body_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        assert body_crc == masked(body), "data CRC"
        pos += 16 + length
        event = Event()
        event.ParseFromString(body)
        assert event.wall_time > 1.5e9
        if event.file_version:
            out["file_version"] = event.file_version
        for v in event.summary.value:
            out["scalars"].append([event.step, v.tag, v.simple_value])
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
