// Ascend SHMEM's host API as symm uses it (hicann/shmem v1.0 to v1.5): declarations, enum values
// and struct layouts transcribed from ../shared/reference/ascend-ffi.md (§1.3, §2.3), which cites
// `include/host/**` and `include/host_device/shmem_common_types.h` of hicann/shmem @ 643bfb73
// and the tags v1.0.0 to v1.5.1. The library's own headers are not in a package CI can download;
// tests/headers.rs checks the Rust bindings against this file as it checks ACL against the real
// headers. Keep it a transcription: change it only with the note (or the real headers) in hand.
#pragma once
#include <cstddef>
#include <cstdint>
#include "acl/acl_base.h"

extern "C" {

enum aclshmem_error_code_t : int {
    ACLSHMEM_SUCCESS = 0,
    ACLSHMEM_INVALID_PARAM = -1,
    ACLSHMEM_INVALID_VALUE = -2,
    ACLSHMEM_SMEM_ERROR = -3,
    ACLSHMEM_INNER_ERROR = -4,
    ACLSHMEM_NOT_INITED = -5,
    ACLSHMEM_BOOTSTRAP_ERROR = -6,
    ACLSHMEM_TIMEOUT_ERROR = -7,
    ACLSHMEM_MALLOC_FAILED = -8,
    ACLSHMEM_DL_FUNC_FAILED = -9,
    ACLSHMEM_INNER_TIMEOUT = -10,
    ACLSHMEM_UNDER_API_UNLOAD = -11,
    ACLSHMEM_NOT_SUPPORTED = -100,
};

enum aclshmemx_bootstrap_t : unsigned int {
    ACLSHMEMX_INIT_WITH_DEFAULT = 1 << 0,
    ACLSHMEMX_INIT_WITH_MPI = 1 << 1,
    ACLSHMEMX_INIT_WITH_UNIQUEID = 1 << 3,
    ACLSHMEMX_INIT_MAX = 1u << 31,
};

enum aclshmemx_init_status_t {
    ACLSHMEM_STATUS_NOT_INITIALIZED = 0,
    ACLSHMEM_STATUS_SHM_CREATED = 1,
    ACLSHMEM_STATUS_IS_INITIALIZED = 2,
};

enum data_op_engine_type_t {
    ACLSHMEM_DATA_OP_MTE = 0x01,
    ACLSHMEM_DATA_OP_SDMA = 0x02,
    ACLSHMEM_DATA_OP_ROCE = 0x04,
};

enum aclshmem_mem_type_t { ACLSHMEM_HOST_SIDE = 0, ACLSHMEM_DEVICE_SIDE = 1 };

enum aclshmem_signal_op_type_t { ACLSHMEM_SIGNAL_SET = 0, ACLSHMEM_SIGNAL_ADD = 1 };

enum aclshmem_cmp_op_type_t {
    ACLSHMEM_CMP_EQ = 0,
    ACLSHMEM_CMP_NE = 1,
    ACLSHMEM_CMP_GT = 2,
    ACLSHMEM_CMP_GE = 3,
    ACLSHMEM_CMP_LT = 4,
    ACLSHMEM_CMP_LE = 5,
};

typedef int aclshmem_team_t;
enum aclshmem_team_index_t { ACLSHMEM_TEAM_INVALID = -1, ACLSHMEM_TEAM_WORLD = 0 };

#define ACLSHMEM_UNIQUE_ID_INNER_LEN 124

typedef struct {
    int version;
    data_op_engine_type_t data_op_engine_type;
    uint32_t shm_init_timeout;
    uint32_t shm_create_timeout;
    uint32_t control_operation_timeout;
    int32_t sockFd;
} aclshmem_init_optional_attr_t;

typedef struct {
    int my_pe;
    int n_pes;
    char ip_port[64];
    uint64_t local_mem_size;
    aclshmem_init_optional_attr_t option_attr;
    void *comm_args;
    uint64_t instance_id;
} aclshmemx_init_attr_t;

typedef struct {
    int32_t version;
    int my_pe;
    int n_pes;
    char internal[ACLSHMEM_UNIQUE_ID_INNER_LEN];
} aclshmemx_uniqueid_t;

int aclshmemx_get_uniqueid(aclshmemx_uniqueid_t *uid);
int aclshmemx_set_attr_uniqueid_args(int my_pe, int n_pes, int64_t local_mem_size, aclshmemx_uniqueid_t *uid,
                                     aclshmemx_init_attr_t *aclshmem_attr);
int aclshmemx_init_attr(aclshmemx_bootstrap_t bootstrap_flags, aclshmemx_init_attr_t *attributes);
int aclshmemx_init_status(void);
int aclshmem_finalize(void);
int aclshmemx_finalize(uint64_t instance_id);

void *aclshmem_malloc(size_t size);
void aclshmem_free(void *ptr);
void *aclshmemx_get_heap_base(aclshmem_mem_type_t mem_type);
void *aclshmem_ptr(void *ptr, int pe);

int aclshmem_my_pe(void);
int aclshmem_n_pes(void);
int aclshmem_team_split_strided(aclshmem_team_t parent_team, int pe_start, int pe_stride, int pe_size,
                                aclshmem_team_t *new_team);
int aclshmem_team_translate_pe(aclshmem_team_t src_team, int src_pe, aclshmem_team_t dest_team);
void aclshmem_team_destroy(aclshmem_team_t team);
int aclshmem_team_my_pe(aclshmem_team_t team);
int aclshmem_team_n_pes(aclshmem_team_t team);

void aclshmemx_putmem_on_stream(void *dst, void *src, size_t elem_size, int32_t pe, aclrtStream stream);
void aclshmemx_getmem_on_stream(void *dst, void *src, size_t elem_size, int32_t pe, aclrtStream stream);
void aclshmemx_quiet_on_stream(aclrtStream stream);
void aclshmemx_signal_op_on_stream(int32_t *sig_addr, int32_t signal, int sig_op, int pe, aclrtStream stream);
void aclshmemx_signal_wait_until_on_stream(int32_t *sig_addr, int cmp, int32_t cmp_val, aclrtStream stream);
void aclshmemx_barrier_on_stream(aclshmem_team_t team, aclrtStream stream);
void aclshmemx_barrier_all_on_stream(aclrtStream stream);

}  // extern "C"

// The constants the bindings define outside the enums.
constexpr int ACLSHMEM_UNIQUEID_VERSION = (1 << 16) + 136;
constexpr int ACLSHMEM_OPTIONAL_ATTR_VERSION = (1 << 16) + 24;
constexpr uint64_t ACLSHMEM_MAX_LOCAL_SIZE = 40ull << 30;
constexpr uint64_t ACLSHMEM_PAGE_SIZE = 2ull << 20;
