/*
 * The row layout etp/param.h documents for a sharded parameter, computed
 * from its configuration alone, and an assertion that etp_param_info agrees.
 * The shard tests index their references by these rows: taking them from
 * the library under test would let a wrong layout check itself. Used by
 * test_shard.c, test_shard_graph.c and test_shard_quant.c.
 */
#ifndef ETP_TEST_SHARD_LAYOUT_H
#define ETP_TEST_SHARD_LAYOUT_H

#include "mpi_util.h"

typedef struct {
    int64_t experts, padded_rows, shard_rows, shard_row_begin, valid_shard_rows;
} tu_shard_layout_t;

/* A parameter of `rows` rows per expert over a group of group_size ranks,
 * as its rank group_rank holds it. */
static inline tu_shard_layout_t tu_shard_layout(int64_t experts, int64_t rows, int alignment,
                                                int group_size, int group_rank)
{
    tu_shard_layout_t l;
    l.experts = experts > 1 ? experts : 1;
    const int64_t unit = (int64_t)group_size * (alignment > 1 ? alignment : 1);
    /* counted up rather than divided: the smallest multiple of unit that
     * holds every row, reached without the library's own rounding formula */
    l.padded_rows = unit;
    while (l.padded_rows < rows) l.padded_rows += unit;
    l.shard_rows = l.padded_rows / group_size;
    l.shard_row_begin = (int64_t)group_rank * l.shard_rows;
    int64_t valid = rows - l.shard_row_begin;
    l.valid_shard_rows = valid < 0 ? 0 : valid > l.shard_rows ? l.shard_rows : valid;
    return l;
}

/* Assert that p, created from pc over a group of group_size ranks where
 * this rank is group_rank, reports the documented layout; returns it. */
static inline tu_shard_layout_t tu_assert_shard_layout(const etp_param_t *p,
                                                       const etp_param_config_t *pc,
                                                       int group_size, int group_rank)
{
    tu_shard_layout_t l = tu_shard_layout(pc->experts, pc->rows, pc->alignment, group_size, group_rank);
    const int64_t unit = (int64_t)group_size * (pc->alignment > 1 ? pc->alignment : 1);
    /* the test's own arithmetic first: a multiple of unit, the smallest
     * one that holds the rows, split evenly */
    assert_int_equal(l.padded_rows % unit, 0);
    assert_true(l.padded_rows >= pc->rows && l.padded_rows - unit < pc->rows);
    assert_int_equal(l.shard_rows * group_size, l.padded_rows);
    etp_param_info_t info = ETP_PARAM_INFO_INIT;
    ETP_OK(etp_param_info(p, &info));
    assert_int_equal(info.experts, l.experts);
    assert_int_equal(info.rows, pc->rows);
    assert_int_equal(info.cols, pc->cols);
    assert_int_equal(info.padded_rows, l.padded_rows);
    assert_int_equal(info.shard_rows, l.shard_rows);
    assert_int_equal(info.shard_row_begin, l.shard_row_begin);
    assert_int_equal(info.valid_shard_rows, l.valid_shard_rows);
    assert_int_equal(info.dtype, pc->dtype);
    assert_int_equal(info.wgrad_dtype, (int)pc->wgrad_dtype == -1 ? pc->dtype : pc->wgrad_dtype);
    assert_non_null(info.shard);
    assert_non_null(info.main_grad);
    if (pc->master)
        assert_non_null(info.master);
    else
        assert_null(info.master);
    return l;
}

#endif
