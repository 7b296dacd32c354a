//! The kubelet's pod-resources API messages that gpufrag reads (`proto/podresources_v1.proto`:
//! package `v1`, service `PodResourcesLister`, method `List`), as prost structs written by hand
//! with the upstream field numbers, so that no protoc step is needed. Only the fields gpufrag
//! reads are declared; the decoder skips the others (CPU ids, memory, topology, dynamic
//! resources) as protobuf does any unknown field.

/// `ListPodResourcesRequest` (empty).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesRequest {}

/// `ListPodResourcesResponse`: every pod on the node.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesResponse {
    /// `pod_resources = 1`.
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

/// `PodResources`: a pod and its containers.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodResources {
    /// `name = 1`: the pod's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// `namespace = 2`.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// `containers = 3`.
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

/// `ContainerResources`: a container and the devices given to it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    /// `name = 1`: the container's name in the pod spec.
    #[prost(string, tag = "1")]
    pub name: String,
    /// `devices = 2`.
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
}

/// `ContainerDevices`: the devices of one device-plugin resource.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerDevices {
    /// `resource_name = 1` (`nvidia.com/gpu`, ...).
    #[prost(string, tag = "1")]
    pub resource_name: String,
    /// `device_ids = 2`: the plugin's ids (NVIDIA's: GPU or MIG UUIDs).
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
}
