"""The constants that were measured on one asset, in one place, each with its measurement.

Everything else the skills know about a scene (the surface an object stands on, a container's
centre, extent and yaw) comes from perception. What is here cannot: it is collision geometry
the cameras do not see (they see the visual meshes), measured on LIBERO's basket
(`basket_1`, libero_object and the posvar/grocery families), and on the akita bowl.
"""

from __future__ import annotations

import numpy as np

# -- LIBERO's basket, in the container frame `geometry.container_frame` gives (its longer side
# along y) -----------------------------------------------------------------------------------
# Outside 15.8 x 16.7 cm, inside 11.8 x 12.7 cm at the floor, its collision walls leaning out
# to 12.4 x 13.3 cm at the rim: walls and a 4 mm margin take 2.4 cm a side. (Its outer hull
# from depth is a few mm off either way.)
WALL = 0.024
WALL_SLANT = 0.004  # the walls lean out: the inside is this much wider at the rim
# Fingers reaching over a wall may dip this far below its rim: the pads are thin and the walls
# lean out (measured: released 2 cm under the rim, standing things were placed cleanly).
RIM_DIP = 0.025
REACH = 0.045  # the goal region ends about 6 cm from the centre: keep centres within this
FLOOR = 0.017  # the basket's floor stands this high above its bottom
# The walls plus a margin, for "is it inside": the centre of what is in is this far in.
INSIDE_MARGIN = 0.025
# Slots fill rows from the container frame's -y wall and +x end. The basket's collision walls
# sit about 3 mm towards its frame's -y and 2 mm towards +x of the middle of what the cameras
# see (measured with the basket as it stands in libero_object: 3 mm towards world +y, 2 mm
# towards -x, its frame turned by this): turned half round, the rows start from the walls
# with room to spare, and the tight sides fill last. The visual mesh is symmetric, so which
# of the two ends is which is not seen: the frame is right up to this half turn, and a basket
# turned by a half turn from its usual pose fills from the tight walls (3 mm less room).
CONTAINER_TURN = np.pi

# -- LIBERO's akita black bowl (libero_spatial, libero_goal), gripped by its rim ----------------
# It is 10.7 cm across, wider than the fingers open: one finger goes inside the wall, one
# outside. Its collision wall is 2.6 mm thick and leans out about 19 degrees; the grip site goes
# this far in from the outer edge seen, and this far under the rim (measured on libero_spatial
# tasks 0, 3, 4, 7, 9 seeds 0-2, one grasp each: 2 cm under the rim held 15/15, 2.6 cm 10/15,
# 3.2 cm 13/15).
RIM_IN, RIM_DOWN = 0.008, 0.02
# On the wall the fingers stop 8 mm apart and squeeze to 3.4 mm as it is lifted: any gap at
# all holds it (whether it rose tells).
RIM_HOLD_WIDTH = 0.0015

# -- perception of widths ------------------------------------------------------------------------
# A box fitted to a point cloud encloses every point seen, so it reads a few mm wide of the
# object; a grasp is refused as too wide for the fingers only beyond this much over their reach.
WIDTH_SLACK = 0.005

# -- LIBERO's cabinets' drawers (wooden_cabinet, white_cabinet; libero_goal, libero_10) ----------
# Each drawer front is 6.8 cm tall (collision box half 0.034 m); its points are taken this far
# either side of the drawer's height, clear of the neighbours' fronts.
DRAWER_BAND = 0.025
# The handle is a bar 1.6 cm deep (collision box half 0.008 m) standing 1.6 cm off the front
# (its face at 2.4 cm behind the bar's centre): the points this close to the furthest-out one
# are the handle's.
HANDLE_DEPTH = 0.016
# The hand, level, grips the bar from the front, fingers closing on its top and bottom: the grip
# site goes this far behind the bar's centre (the fingertips stop short of the front behind it).
HANDLE_REACH = 0.0
STANDOFF = 0.06  # the hand turns level this far out in front of the handle
# The inside of a drawer's front stands this far behind its handle's furthest-out point
# (bar 1.6 cm + its 0.8 cm posts + the front's 1.2 cm wall).
DRAWER_FRONT_IN = 0.036
# A drawer's inside reaches this far above and below its height (its region site's).
DRAWER_DEPTH = 0.05
# A drawer slides 0.16 m (its joint's range); LIBERO counts it open beyond 0.14 m out.
DRAWER_OPEN_TRAVEL = 0.15
# A drawer is pushed shut with the hand pointing this far down from level into its front: the
# fingertips lead, the hand's body stays off the drawer above, and the arm stays clear of what
# stands beside the cabinet (level, it swung into libero_10 task 3's wine rack).
PUSH_TILT = np.pi / 4

# -- LIBERO's microwave door (libero_10 task 9, libero_90) ---------------------------------------
# The door is pushed at this share of its reach from the hinge (near its free end, off its
# handle), starting this far on the side it is pushed from.
DOOR_PUSH_AT, DOOR_PUSH_BEHIND = 0.75, 0.05
# LIBERO counts the door closed within 0.005 rad of shut.
DOOR_CLOSED = 0.005
# What goes in under its roof comes in level with its bottom this far over the heating
# region's floor: the microwave's front lip stands about at the floor (a mug standing inside
# has its body at z 0.945 over a floor at 0.936; one carried in with its body at 0.945,
# 1.2 cm up, caught on the lip and tipped back in the hand: libero_10 task 9 seed 1). With
# 2.5 cm a mug 10 cm tall still passes under the roof, 16 cm over the floor.
ENTRY_CLEAR = 0.025
# -- LIBERO's flat stove (libero_goal, libero_10, libero_90) --------------------------------------
# Its knob's handle bar (7 x 2.6 cm, `flat_stove.xml`) stands up to 3 cm over the burner plate
# (measured: the plate's top at 0.930, the bar's top 0.959 on main_table; points more than 1 cm
# over the plate are the bar alone).
KNOB_ABOVE = 0.01
KNOB_GRIP_DOWN = 0.02  # the grip site this far under the bar's top: the pads on the bar
# The asset's hinge turns counter-clockwise seen from above (axis +z) from 0 (off) to its limit
# 2.1 rad; LIBERO's `FlatStove.turn_on` reads it on from 0.5 rad. The wrist turns it twice that
# for a margin on what the grip slips.
KNOB_ON_TURN = 0.5
KNOB_TURN = 1.0

# -- pushing beside a fixture --------------------------------------------------------------------
# "The front of the stove": libero_goal's main_table_stove_front_region lies this far beyond
# the plate's edge when the plate's edge touches the stove's front edge seen (measured, task 5
# seeds 0-4: 0.042 m with the stove at its nominal x, 0.055 m where it stands 1.5 cm farther
# back; the region is fixed on the table while the stove jitters). The middle of the two.
PUSH_CLEARANCE = 0.05
