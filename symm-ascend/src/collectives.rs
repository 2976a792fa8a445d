//! The collectives of the Ascend backend: the framework's reference collectives
//! (`symm_core::coll::reference`) on this backend's primitives, one state per group
//! ([`AscendComm::reference_cache`]). Their local steps run on the device: what arrived is
//! copied out by gets from the rank itself, the reductions are plans of aclnn operators
//! (`reduce_local`, [`crate::reduce`]), and so does low-precision transport's codec
//! (`encode_local`, `reduce_encoded_local`, [`crate::codec`]); only descriptors, message
//! headers and the codec's per-block numbers pass through the host.

use symm_core::coll::Collectives;

use crate::comm::AscendComm;

impl Collectives for AscendComm {
    symm_core::collectives_by_reference!(reference_cache);
}
