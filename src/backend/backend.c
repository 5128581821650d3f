/* What both backends share. */
#include <string.h>

#include "backend.h"

const char *etp__coll_name(etp__coll_kind_t kind)
{
    switch (kind) {
    case ETP__COLL_ALLGATHER: return "allgather";
    case ETP__COLL_REDUCE_SCATTER: return "reduce_scatter";
    case ETP__COLL_ALLREDUCE: return "allreduce";
    case ETP__COLL_ALLTOALLV: return "alltoallv";
    }
    return "unknown";
}

etp_status_t etp__be_fail(etp__be_t *be, etp_status_t status)
{
    if (!be->failed) {
        be->failed = 1;
        be->fail_status = status;
        strncpy(be->fail_msg, etp_last_error(), sizeof be->fail_msg - 1);
        be->fail_msg[sizeof be->fail_msg - 1] = '\0';
        ETP__LOG(be->log, ETP_LOG_ERROR, ETP_SUBSYS_BACKEND, "context aborted: %s", be->fail_msg);
    }
    return status;
}
