//! The generated skeleton of `bpf/gpufrag.bpf.c` (build.rs writes it into `OUT_DIR`).
#![allow(missing_docs, clippy::all, clippy::unwrap_used, unsafe_op_in_unsafe_fn, non_camel_case_types, dead_code)]
include!(concat!(env!("OUT_DIR"), "/gpufrag.skel.rs"));
