"""A stand-in for the kubelet's pod-resources socket, for tests/pod_resources.rs.

A real gRPC server (Python grpcio, a generic handler for v1.PodResourcesLister/List) on a Unix
socket, its messages built by Google's protobuf from descriptors written here from the field
numbers of proto/podresources_v1.proto: an implementation of the wire format separate from
gpufrag's prost structs. It answers every List with the pods of a JSON file:

    [{"name": "trainer-0", "namespace": "ml",
      "containers": [{"name": "main", "devices": [{"resource_name": "nvidia.com/gpu",
                                                   "device_ids": ["GPU-..."]}]}]}]

and, besides the fields gpufrag reads, fields it does not (cpu_ids, memory, a topology), as the
kubelet sends them. --pad N adds N bytes of pods to the answer (an oversized one). It prints
READY once listening and serves until killed; each call is written to stderr.

Usage: server.py SOCKET PODS.json [--pad N]
"""

import json
import sys
import time
from concurrent import futures

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def build():
    f = descriptor_pb2.FileDescriptorProto(name="gpufrag_test_podresources_v1.proto", package="v1", syntax="proto3")

    def msg(name, fields):
        m = f.message_type.add(name=name)
        for fname, num, ftype, label, tname in fields:
            fd = m.field.add(name=fname, number=num, type=ftype, label=label)
            if tname:
                fd.type_name = ".v1." + tname

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    msg("ListPodResourcesRequest", [])
    msg("ListPodResourcesResponse", [("pod_resources", 1, F.TYPE_MESSAGE, rep, "PodResources")])
    msg("PodResources", [
        ("name", 1, F.TYPE_STRING, opt, None),
        ("namespace", 2, F.TYPE_STRING, opt, None),
        ("containers", 3, F.TYPE_MESSAGE, rep, "ContainerResources"),
    ])
    msg("ContainerResources", [
        ("name", 1, F.TYPE_STRING, opt, None),
        ("devices", 2, F.TYPE_MESSAGE, rep, "ContainerDevices"),
        ("cpu_ids", 3, F.TYPE_INT64, rep, None),
        ("memory", 4, F.TYPE_MESSAGE, rep, "ContainerMemory"),
    ])
    msg("ContainerMemory", [
        ("memory_type", 1, F.TYPE_STRING, opt, None),
        ("size", 2, F.TYPE_UINT64, opt, None),
        ("topology", 3, F.TYPE_MESSAGE, opt, "TopologyInfo"),
    ])
    msg("ContainerDevices", [
        ("resource_name", 1, F.TYPE_STRING, opt, None),
        ("device_ids", 2, F.TYPE_STRING, rep, None),
        ("topology", 3, F.TYPE_MESSAGE, opt, "TopologyInfo"),
    ])
    msg("TopologyInfo", [("nodes", 1, F.TYPE_MESSAGE, rep, "NUMANode")])
    msg("NUMANode", [("ID", 1, F.TYPE_INT64, opt, None)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    get = lambda n: message_factory.GetMessageClass(pool.FindMessageTypeByName("v1." + n))
    return get("ListPodResourcesRequest"), get("ListPodResourcesResponse")


def main():
    sock, pods_file = sys.argv[1], sys.argv[2]
    pad = int(sys.argv[sys.argv.index("--pad") + 1]) if "--pad" in sys.argv else 0
    Request, Response = build()
    pods = json.load(open(pods_file))

    def answer():
        r = Response()
        for p in pods:
            pr = r.pod_resources.add(name=p["name"], namespace=p["namespace"])
            for c in p["containers"]:
                cr = pr.containers.add(name=c["name"])
                cr.cpu_ids.extend([2, 3])
                cr.memory.add(memory_type="memory", size=1 << 30).topology.nodes.add(ID=0)
                for d in c.get("devices", []):
                    cd = cr.devices.add(resource_name=d["resource_name"])
                    cd.device_ids.extend(d["device_ids"])
                    cd.topology.nodes.add(ID=0)
        n = 0
        while n < pad:
            pr = r.pod_resources.add(name="pad-%d" % n, namespace="padding")
            pr.containers.add(name="x" * 1000)
            n += 1030
        return r

    def list_pods(request, context):
        sys.stderr.write("List called\n")
        sys.stderr.flush()
        return answer()

    handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(
            list_pods, request_deserializer=Request.FromString, response_serializer=lambda m: m.SerializeToString()),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_send_message_length", 64 << 20)])
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port("unix:" + sock)
    server.start()
    print("READY", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
