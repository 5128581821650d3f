/*
 * What model.c and checkpoint.c share: the model's state and the helpers
 * both use. Private to etp-train.
 */
#ifndef TRAIN_MODEL_INTERNAL_H
#define TRAIN_MODEL_INTERNAL_H

#include <stdio.h>

#include "etp/gemm.h"
#include "model.h"

#if ETP_HAVE_CUDA
#include "etp/cuda.h"
#endif

#define TRY(expr)                                                                          \
    do {                                                                                   \
        etp_status_t st_ = (expr);                                                         \
        if (st_ != ETP_SUCCESS) {                                                          \
            fprintf(stderr, "etp-train: %s:%d: %s: %s: %s\n", __FILE__, __LINE__, #expr,   \
                    etp_status_string(st_), etp_last_error());                             \
            return st_;                                                                    \
        }                                                                                  \
    } while (0)

#define FAIL(st, ...)                                                                      \
    do {                                                                                   \
        fprintf(stderr, "etp-train: " __VA_ARGS__);                                        \
        fputc('\n', stderr);                                                               \
        return (st);                                                                       \
    } while (0)

/* The products of one weight. */
enum { P_FWD, P_DGRAD, P_WGRAD, P_COUNT };

/* One parameter (a weight of a layer) and what its optimizer keeps. */
typedef struct tparam {
    train_model_t *m;
    etp_param_t *p;
    train_weight_t kind;
    int layer;
    int64_t experts, rows, cols; /* local experts */
    int64_t expert0;             /* first global expert of this rank (grouped) */
    etp_param_info_t info;
    int64_t n;                   /* shard elements */
    float *adam_m, *adam_v;
    etp_group_t *reduce_group;   /* the replicas' gradient sum (NULL: none) */
    int reduce_size;
    uint16_t *whole;             /* resident: the whole weight [experts][rows][cols] */
} tparam_t;

/* What one layer keeps from forward to backward. */
typedef struct tlayer {
    etp_ep_layer_t *ep;
    uint16_t *x;      /* input [T, H] (x of layer 0 is the step's input buffer) */
    uint16_t *u;      /* [T, H] */
    float *probs;     /* [T, E] */
    int64_t *idx;     /* [T, k] */
    float *w;         /* [T, k] */
    uint16_t *recv;   /* [rows, H] */
    uint16_t *a, *s;  /* [rows, F] */
    uint16_t *o;      /* [rows, H] */
    int32_t *counts, *offsets; /* PACKED: host copies of the layout */
} tlayer_t;

struct train_model {
    etp_context_t *ctx;
    etp_stream_t *s;
    train_opts_t o;
    train_shape_t sh;
    etp_backend_t backend;
    int rank, ranks, r_etp, r_ep, r_dp;
    int64_t T, N;     /* this rank's tokens; all ranks' */
    int64_t E_local, rows, S;
    int64_t recv_tokens; /* the EP group's recv_capacity_per_rank */
    etp_group_t *world, *g_etp, *g_ep, *g_dp, *g_edp;
    etp_ep_group_t *epg;
    etp_chain_t *chain;
    moe_ops_t *ops;
    tparam_t *params; /* [layers][TRAIN_WEIGHTS] */
    tlayer_t *layers;
    etp_gemm_plan_t *plan[TRAIN_WEIGHTS][P_COUNT];
    /* step buffers */
    uint16_t *x_in, *target, *y_last; /* x_in = layers[0].x; y_last = the output [T, H] */
    uint16_t *pool_x, *pool_t;        /* [pool][T, H] */
    uint16_t *t_p, *t_m, *g, *gu, *gq, *gm, *gp; /* [T, H] temporaries */
    float *z;                          /* [T, E] */
    uint16_t *dz;                      /* [T, E] */
    float *gw;                         /* [T, k] */
    uint16_t *go, *gr;                 /* [rows, H] */
    uint16_t *gs, *ga;                 /* [rows, F] */
    double *loss_dev, *loss_host;
    float *replica_buf;                /* the replicas' main_grads, gathered */
    size_t replica_bytes;
    void *fill_buf;                    /* model__fill_begin */
    size_t fill_bytes;
    int t;                             /* Adam steps taken */
    etp_graph_t *graph;
    size_t rec_mark;                   /* records the graph holds end here */
    int64_t dropped;
    train_times_t times;
#if ETP_HAVE_CUDA
    cudaStream_t cs;
    cudaEvent_t ev_begin, ev_end, ev_opt;
    cudaEvent_t *ev;  /* pairs around gathers and EP calls */
    int nev, cap_ev;
    int *ev_kind;     /* 0 gather, 1 exchange */
#endif
};

/* "wp", "wr", "w1", "w2": file and parameter names */
const char *model__weight_name(train_weight_t w);
/* The resident copies: every weight whole, from the shards (resident runs). */
etp_status_t model__refresh_resident(train_model_t *m);
/* fill_buf, the staging of weight initialization and checkpoint loads,
 * exists only from begin to end (end waits for its readers and frees it). */
etp_status_t model__fill_begin(train_model_t *m);
etp_status_t model__fill_end(train_model_t *m);

#endif /* TRAIN_MODEL_INTERNAL_H */
