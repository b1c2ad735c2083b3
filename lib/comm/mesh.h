/*
 * mesh.h - the vocabulary every layer above comm shares: the meshes and
 * their named dims, a rank's coordinate and group along a dim, and the
 * collectives that are counted per dim.
 *
 * Pipeline stages are outermost (torchtitan's and Megatron's order): the
 * world is pp stages of dp * cp * tp consecutive ranks each, rank
 * r = stage * (world / pp) + i.  Within a stage, every mesh is a row-major
 * reshape of its ranks i = 0..world/pp-1 into three axes, the last
 * innermost (DESIGN.md §3, as HyperParallel lays them out):
 *   dense  (dp, cp, tp)                          i = (dp*cp + c)*tp + t
 *   fsdp   (dp_replicate, dp_shard, [tp])        the flattened (dp, cp) index
 *          f = dp*cp + c split as f = rep*dp_shard + shard, per tp coordinate
 *   expert (edp_replicate, edp_shard, ep)        an EP group = ep consecutive ranks
 *   pipeline (pp)                                the same i on every stage
 * The group of rank r along dim X is the ranks that differ from r only in
 * X, sorted; groups are listed by their smallest rank.  A layout is the
 * size of every dim (a plan's `size`); the world is pp * dp * cp * tp.
 */
#ifndef HP_MESH_H
#define HP_MESH_H

enum hp_mesh { HP_MESH_DENSE = 0, HP_MESH_FSDP, HP_MESH_EXPERT, HP_MESH_PIPELINE, HP_NMESH };

/* Every named mesh dim; each belongs to one mesh (hp_dim_mesh). */
enum hp_dim {
	HP_DIM_DP = 0, HP_DIM_CP, HP_DIM_TP,                  /* dense */
	HP_DIM_DP_REPLICATE, HP_DIM_DP_SHARD,                 /* fsdp */
	HP_DIM_EDP_REPLICATE, HP_DIM_EDP_SHARD, HP_DIM_EP,    /* expert */
	HP_DIM_PP,                                            /* pipeline */
	HP_NDIM
};
#define HP_COMM_WORLD HP_NDIM       /* the whole world, for global sums */

/* Collectives, for the traffic estimate and the runs' counters. */
enum hp_coll {
	HP_COLL_ALL_GATHER = 0, HP_COLL_REDUCE_SCATTER, HP_COLL_ALL_REDUCE,
	HP_COLL_ALL_TO_ALL, HP_COLL_ALL_TO_ALLV,
	HP_COLL_P2P,        /* point-to-point: a send to one rank of the group (pp) */
	HP_NCOLL
};

/* "dp", "edp_shard", ...; "dense", "fsdp", "expert"; "all_gather", .... */
const char *hp_dim_name(enum hp_dim d);
const char *hp_mesh_name(enum hp_mesh m);
enum hp_mesh hp_dim_mesh(enum hp_dim d);
const char *hp_coll_name(enum hp_coll c);
/* A dim's name, or "world" for HP_COMM_WORLD. */
const char *hp_comm_dim_name(int d);

/* The world of a layout: pp * dp * cp * tp. */
int hp_mesh_world(const int size[HP_NDIM]);
/* Rank r's coordinate along d in the layout size. */
int hp_mesh_coord(const int size[HP_NDIM], enum hp_dim d, int rank);
/* Fill ranks[0..size[d]-1] with rank r's group along d (sorted); returns its size. */
int hp_mesh_group(const int size[HP_NDIM], enum hp_dim d, int rank, int *ranks);

#endif
