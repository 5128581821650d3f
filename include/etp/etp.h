/*
 * etp/etp.h - the umbrella header: everything of etp that needs neither MPI
 * nor CUDA headers. Include etp/mpi.h or etp/cuda.h as well for those.
 */
#ifndef ETP_ETP_H
#define ETP_ETP_H

#include "etp/etp_config.h"
#include "etp/core.h"
#include "etp/context.h"
#include "etp/comm.h"
#include "etp/trace.h"
#include "etp/ep.h"
#include "etp/quant.h"
#include "etp/param.h"
#include "etp/gemm.h"

#endif /* ETP_ETP_H */
