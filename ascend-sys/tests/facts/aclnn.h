// The aclnn declarations symm uses, transcribed from CANN 8.1.RC1's `include/aclnn/acl_meta.h`
// and `include/aclnnop/aclnn_{add,maximum,minimum,div,cast,amax,mul}.h` (also in hicann/ops-math,
// `math/*/op_host/op_api/aclnn_*.h`), and from hicann/ops-math's docs of aclnnAbs, aclnnEqScalar,
// aclnnInplaceMaskedFillScalar and aclCreateIntArray. CANN's headers are not in a package CI can download;
// tests/headers.rs checks the Rust bindings against this file, with ACL's own types
// (aclDataType, aclFormat, aclrtStream) from the real ACL headers of the torch-npu wheel.
#pragma once
#include <cstdint>
#include "acl/acl_base.h"

extern "C" {

typedef struct aclOpExecutor aclOpExecutor;
typedef struct aclTensor aclTensor;
typedef struct aclScalar aclScalar;
typedef struct aclIntArray aclIntArray;
typedef int32_t aclnnStatus;

aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType,
                           const int64_t *stride, int64_t offset, aclFormat format, const int64_t *storageDims,
                           uint64_t storageDimsNum, void *tensorData);
aclScalar *aclCreateScalar(void *value, aclDataType dataType);
aclnnStatus aclDestroyTensor(const aclTensor *tensor);
aclnnStatus aclDestroyScalar(const aclScalar *scalar);
aclIntArray *aclCreateIntArray(const int64_t *value, uint64_t size);
aclnnStatus aclDestroyIntArray(const aclIntArray *array);

aclnnStatus aclnnAddGetWorkspaceSize(const aclTensor *self, const aclTensor *other, const aclScalar *alpha,
                                     aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor);
aclnnStatus aclnnAdd(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, aclrtStream stream);
aclnnStatus aclnnMaximumGetWorkspaceSize(const aclTensor *self, const aclTensor *other, aclTensor *out,
                                         uint64_t *workspaceSize, aclOpExecutor **executor);
aclnnStatus aclnnMaximum(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, aclrtStream stream);
aclnnStatus aclnnMinimumGetWorkspaceSize(const aclTensor *self, const aclTensor *other, aclTensor *out,
                                         uint64_t *workspaceSize, aclOpExecutor **executor);
aclnnStatus aclnnMinimum(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, aclrtStream stream);
aclnnStatus aclnnDivsGetWorkspaceSize(const aclTensor *self, const aclScalar *other, aclTensor *out,
                                      uint64_t *workspaceSize, aclOpExecutor **executor);
aclnnStatus aclnnDivs(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, aclrtStream stream);
aclnnStatus aclnnCastGetWorkspaceSize(const aclTensor *self, const aclDataType dtype, aclTensor *out,
                                      uint64_t *workspaceSize, aclOpExecutor **executor);
aclnnStatus aclnnCast(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, aclrtStream stream);
aclnnStatus aclnnAbsGetWorkspaceSize(const aclTensor *self, aclTensor *out, uint64_t *workspaceSize,
                                     aclOpExecutor **executor);
aclnnStatus aclnnAbs(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, const aclrtStream stream);
aclnnStatus aclnnAmaxGetWorkspaceSize(const aclTensor *self, const aclIntArray *dim, bool keepDim, aclTensor *out,
                                      uint64_t *workspaceSize, aclOpExecutor **executor);
aclnnStatus aclnnAmax(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, aclrtStream stream);
aclnnStatus aclnnMulGetWorkspaceSize(const aclTensor *self, const aclTensor *other, aclTensor *out,
                                     uint64_t *workspaceSize, aclOpExecutor **executor);
aclnnStatus aclnnMul(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, aclrtStream stream);
aclnnStatus aclnnEqScalarGetWorkspaceSize(const aclTensor *self, const aclScalar *other, aclTensor *out,
                                          uint64_t *workspaceSize, aclOpExecutor **executor);
aclnnStatus aclnnEqScalar(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                          const aclrtStream stream);
aclnnStatus aclnnInplaceMaskedFillScalarGetWorkspaceSize(aclTensor *selfRef, const aclTensor *mask,
                                                         const aclScalar *value, uint64_t *workspaceSize,
                                                         aclOpExecutor **executor);
aclnnStatus aclnnInplaceMaskedFillScalar(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                         aclrtStream stream);

}  // extern "C"
