/* Groups: split by color and key, one communicator per stream role. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"

static void destroy_comms(etp_context_t *ctx, etp_group_t *g)
{
    for (int r = 0; r < g->num_roles; r++)
        if (g->comms[r]) ctx->be->ops->comm_destroy(ctx->be, g->comms[r]);
}

etp_status_t etp_group_split(etp_group_t *parent, int color, int key,
                             const etp_group_config_t *config, etp_group_t **group)
{
    ETP__CHECK_NULL(parent, "etp_group_split");
    ETP__CHECK_NULL(group, "etp_group_split");
    ETP__CHECK_ARG(color >= ETP_GROUP_NO_COLOR,
                   "etp_group_split: color %d (expected >= 0, or ETP_GROUP_NO_COLOR)", color);
    etp_group_config_t cfg = ETP_GROUP_CONFIG_INIT;
    ETP__TRY(etp__vs_in(&cfg, config, &etp__vs_group_config, "etp_group_split", "config"));
    ETP__CHECK_ARG(cfg.num_roles >= 1 && cfg.num_roles <= ETP_GROUP_MAX_ROLES,
                   "etp_group_split: num_roles %d not in [1, %d]", cfg.num_roles,
                   ETP_GROUP_MAX_ROLES);
    ETP__CHECK_ARG(cfg.min_ctas >= -1 && cfg.max_ctas >= -1 && cfg.cga_cluster_size >= -1 &&
                       cfg.cta_policy >= -1,
                   "etp_group_split: NCCL settings must be -1 (default) or >= 0");
    ETP__CHECK_ARG(cfg.min_ctas < 0 || cfg.max_ctas < 0 || cfg.min_ctas <= cfg.max_ctas,
                   "etp_group_split: min_ctas %d > max_ctas %d", cfg.min_ctas, cfg.max_ctas);
    ETP__CHECK_ARG(cfg.name == NULL || strlen(cfg.name) < sizeof parent->name,
                   "etp_group_split: name longer than %zu characters", sizeof parent->name - 1);
    etp_context_t *ctx = parent->ctx;
    ETP__TRY(etp__ctx_usable(ctx, "etp_group_split"));
    /* collective over the parent's role 0, like any of its collectives */
    ETP__TRY(etp__group_ready(parent, 1, "etp_group_split"));

    etp_group_t *g = calloc(1, sizeof *g);
    if (!g) return etp__err(ETP_ERR_OUT_OF_MEMORY, "etp_group_split: out of memory");
    g->ctx = ctx;
    g->parent = parent;
    g->num_roles = cfg.num_roles;
    if (cfg.name)
        snprintf(g->name, sizeof g->name, "%s", cfg.name);
    else
        snprintf(g->name, sizeof g->name, "group%d", color);

    etp__be_t *be = ctx->be;
    etp_status_t st = be->ops->comm_split(be, parent->comms[0], color, key, &cfg, &g->comms[0]);
    if (st == ETP_SUCCESS && g->comms[0] == NULL) {
        free(g);
        *group = NULL;
        return ETP_SUCCESS;
    }
    /* Further roles are plain duplicates of role 0, collective over the new group. */
    for (int r = 1; r < g->num_roles && st == ETP_SUCCESS; r++) {
        int rank = be->ops->comm_rank(g->comms[0]);
        st = be->ops->comm_split(be, g->comms[0], 0, rank, &cfg, &g->comms[r]);
    }
    if (st != ETP_SUCCESS) {
        destroy_comms(ctx, g);
        free(g);
        return st;
    }
    g->rank = be->ops->comm_rank(g->comms[0]);
    g->size = be->ops->comm_size(g->comms[0]);
    parent->children++;
    ctx->num_groups++;
    g->next_group = ctx->groups;
    ctx->groups = g;
    ETP__LOG(&ctx->log, ETP_LOG_INFO, ETP_SUBSYS_COMM,
             "group '%s': rank %d of %d, %d role(s), split from '%s' (color %d, key %d)", g->name,
             g->rank, g->size, g->num_roles, parent->name, color, key);
    *group = g;
    return ETP_SUCCESS;
}

etp_status_t etp_group_destroy(etp_group_t *group)
{
    if (!group) return ETP_SUCCESS;
    etp_context_t *ctx = group->ctx;
    ETP__TRY(etp__ctx_no_capture(ctx, "etp_group_destroy"));
    if (group == ctx->world)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "etp_group_destroy: the world group belongs to the context");
    if (group->children)
        return etp__err(ETP_ERR_BUSY,
                        "etp_group_destroy: group '%s' still has %d group(s) split from it",
                        group->name, group->children);
    if (group->users)
        return etp__err(ETP_ERR_BUSY,
                        "etp_group_destroy: group '%s' is still used by %d parameter(s), chain(s) "
                        "or EP group(s); destroy them first",
                        group->name, group->users);
    if (group->graph_refs)
        return etp__err(ETP_ERR_BUSY,
                        "etp_group_destroy: group '%s' has collectives in %d graph(s); destroy them "
                        "first", group->name, group->graph_refs);
    if (group->windows)
        return etp__err(ETP_ERR_BUSY,
                        "etp_group_destroy: group '%s' still has %d registered buffer(s) (gather "
                        "slots of a chain: destroy the chain first)",
                        group->name, group->windows);
    destroy_comms(ctx, group);
    for (etp_group_t **pp = &ctx->groups; *pp; pp = &(*pp)->next_group)
        if (*pp == group) {
            *pp = group->next_group;
            break;
        }
    group->parent->children--;
    ctx->num_groups--;
    free(group);
    return ETP_SUCCESS;
}

etp_status_t etp_group_rank(const etp_group_t *group, int *rank)
{
    ETP__CHECK_NULL(group, "etp_group_rank");
    ETP__CHECK_NULL(rank, "etp_group_rank");
    *rank = group->rank;
    return ETP_SUCCESS;
}

etp_status_t etp_group_size(const etp_group_t *group, int *size)
{
    ETP__CHECK_NULL(group, "etp_group_size");
    ETP__CHECK_NULL(size, "etp_group_size");
    *size = group->size;
    return ETP_SUCCESS;
}

etp_status_t etp_group_num_roles(const etp_group_t *group, int *num_roles)
{
    ETP__CHECK_NULL(group, "etp_group_num_roles");
    ETP__CHECK_NULL(num_roles, "etp_group_num_roles");
    *num_roles = group->num_roles;
    return ETP_SUCCESS;
}

const char *etp_group_name(const etp_group_t *group)
{
    return group ? group->name : NULL;
}
