"""The kubelet's PodResources API v1, as the kubelet serves it on its pod-resources socket.

api.proto is k8s.io/kubelet's pkg/apis/podresources/v1/api.proto, unchanged (Apache-2.0, The Kubernetes
Authors), from github.com/kubernetes/kubelet at commit 63b3249724f7d89a8aa48f9acb3811f193c9aa68
(sha256 b261f07b951c6ae807c90a3137475733a105c085d3fee62ac62199e0d986c823; the test pins both).
api_pb2.py is generated from it, from the repository root, with grpcio-tools 1.85.1:

    python -m grpc_tools.protoc -I . --python_out=. collectors/podresources_v1/api.proto

Only the messages are generated: collectors.podresources calls the one method it needs (List) by its
full name, so no gRPC stubs are needed.
"""
